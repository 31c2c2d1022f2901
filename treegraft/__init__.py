"""TreeGraft: a weak and a strong drafter build one shared draft tree that the target verifies
in a single forward pass. Public API: load_trio, Engine, GenConfig, GraftConfig, generate."""

import os

# No hub at run time: an unknown model must fail at once with a clear message, not retry a socket.
# Set before transformers / huggingface_hub are imported anywhere, since they read it at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from .engine import METHODS, ConfigError, Engine, GenConfig
from .graft import GraftConfig
from .models import ModelLoadError, Trio, load_trio
from .record import StepRecord


def generate(trio: Trio, prompt_ids: list[int], **settings) -> tuple[list[int], list[StepRecord]]:
    """Run one prompt to the end with the CLI's defaults (GenConfig.defaults) and any GenConfig field
    in `settings`; returns (new token ids, step records)."""
    engine = Engine(trio, GenConfig.defaults(**settings))
    records = list(engine.generate(prompt_ids))
    return engine.new_tokens, records


__all__ = ["METHODS", "ConfigError", "Engine", "GenConfig", "GraftConfig", "ModelLoadError", "Trio",
           "load_trio", "StepRecord", "generate"]
