import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tiny models are dominated by thread hand-offs; one thread is faster and immune to a busy neighbour.
torch.set_num_threads(int(os.environ.get("TREEGRAFT_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def default_trio():
    """The real embedded default trio, fp32: exactness checks belong in fp32 (FACTS.md)."""
    from treegraft.models import load_trio
    return load_trio(dtype="float32", device=os.environ.get("TREEGRAFT_TEST_DEVICE", "cpu"))


@pytest.fixture(scope="session")
def chat_ids(default_trio):
    from treegraft.options import encode_prompt

    def encode(text):
        return encode_prompt(default_trio.tokenizer, text, raw=False)
    return encode
