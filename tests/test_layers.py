"""The package imports one way: each treegraft module may import its own layer or the layers below,
never above, and no chain of imports (function-level ones included) comes back to where it started.
Read from the source with ast: nothing is imported to check it."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "treegraft"

# Lowest first. A subpackage (bench, distill) is one entry: its modules share its layer.
LAYERS = [
    ("model plumbing", {"errors", "chunks", "fastpath", "quantize", "vocab", "trios", "models", "kv", "eagle", "skip", "lookup", "tree",
                        "record", "costs"}),
    ("method", {"treegraft", "draft", "graft", "verify", "schedule", "budget", "calibrate", "engine"}),  # treegraft: the public API
    ("options", {"options"}),  # settings and prompts from the outside world, shared by every front end
    ("tooling and presentation", {"distill", "bench", "scheduler_train", "profile", "viz", "colors"}),
    ("entry points", {"cli", "__main__"}),
]
LAYER = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


MODULES = modules()


def layer_of(module: str) -> int:
    key = module.split(".")[1] if "." in module else module
    if key not in LAYER:
        pytest.fail(f"{module} is in no layer: add it to LAYERS in tests/test_layers.py")
    return LAYER[key]


def imports(module: str) -> set[str]:
    """Every treegraft module `module` imports, anywhere in its body: `from .x import y` is module x,
    or module x.y where y is a submodule."""
    f = MODULES[module]
    package = module if f.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in MODULES else base)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                for k in range(len(parts), 0, -1):
                    if ".".join(parts[:k]) in MODULES:
                        out.add(".".join(parts[:k]))
                        break
    return {m for m in out if m in MODULES and m != module}


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_has_a_layer():
    for m in MODULES:
        layer_of(m)


def test_no_upward_import():
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
              for m, deps in sorted(GRAPH.items()) for d in sorted(deps) if layer_of(d) > layer_of(m)]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    state, cycles = {}, []

    def visit(m, path):
        state[m] = "open"
        for d in sorted(GRAPH[m]):
            if state.get(d) == "open":
                cycles.append(" -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_nothing_imports_the_command_line():
    assert not [m for m, deps in GRAPH.items() if "treegraft.cli" in deps and m != "treegraft.__main__"]


def test_the_checker_sees_relative_and_function_level_imports():
    assert "treegraft.eagle" in GRAPH["treegraft.distill.features"]      # from .. import eagle
    assert "treegraft.distill.lm" in GRAPH["treegraft.distill"]          # from . import features, lm
    assert "treegraft.bench.prompts" in GRAPH["treegraft.distill.sources"]
    assert "treegraft.options" in GRAPH["treegraft.cli"]
