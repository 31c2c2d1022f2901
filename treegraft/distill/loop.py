"""The one training loop every drafter design runs, and what designs share around it.

A design (treegraft.distill.lm, treegraft.distill.features) builds its model and says what one unit of
work is (draw a batch, compute its loss, `update`); `train_segment` does the rest the same way for
all: time-boxed segments that resume from the last checkpoint (model's trainable tensors, optimizer,
counters), a learning rate that warms up and then decays by training *time*, a checkpoint every few
minutes and on SIGTERM, and held-out agreement logged to log.jsonl as it goes."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch
from tqdm import tqdm

from ..models import REPO_ROOT

CKPT = Path(os.environ.get("TREEGRAFT_CKPT", REPO_ROOT / "checkpoints"))


def log_line(path: Path, obj: dict) -> None:
    obj = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())} | obj
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")
    print(json.dumps(obj), flush=True)


def read_log(path: Path) -> dict:
    """A checkpoint directory's log.jsonl: its segment starts and its held-out evals."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return {"starts": [x for x in lines if x.get("event") == "start"],
            "evals": [x for x in lines if x.get("event") == "eval"]}


# ---------------------------------------------------------------- batches

def collate(samples: list[dict]):
    """Right padding needs no attention mask in a causal model; logits are taken only where a label is."""
    width = max(len(s["ids"]) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    rows, cols = [], []
    for b, s in enumerate(samples):
        n, st = len(s["ids"]), s["start"]
        ids[b, :n] = s["ids"]
        rows += [b] * (n - st)
        cols += range(st - 1, n - 1)
    topi = torch.cat([s["topi"] for s in samples])
    topv = torch.cat([s["topv"] for s in samples])
    return ids, torch.tensor(rows), torch.tensor(cols), topi, topv


def frequent_tokens(samples: list[dict], n: int, vocab: int) -> torch.Tensor:
    counts = torch.bincount(torch.cat([s["topi"][:, 0] for s in samples]), minlength=vocab)
    return counts.topk(min(n, vocab)).indices


def candidates(frequent: torch.Tensor, topi: torch.Tensor, negatives: int, vocab: int):
    """The softmax over 49k tokens dominates training cost on a CPU. Restrict it to the target's
    top-k at every label position of the batch (the hard negatives), the most frequent tokens, and
    fresh random negatives: without those, hidden states drift towards rare tokens that are never
    pushed down (measured: half the strong drafter's argmaxes became junk like 'phthalm').
    Returns candidate ids and top-k remapped into them."""
    extra = torch.randint(0, vocab, (negatives,))
    cand = torch.unique(torch.cat([frequent, topi.flatten(), extra]))
    return cand, torch.searchsorted(cand, topi)


def distill_loss(logq: torch.Tensor, topi: torch.Tensor, topv: torch.Tensor) -> torch.Tensor:
    """Half hard CE on the target's greedy token (what acceptance needs), half soft CE on its
    renormalised top-k (the ranking below the argmax: it guides the tree's other branches).
    logq: the drafter's log-probs over the same ids topi indexes."""
    hard = -logq.gather(1, topi[:, :1]).mean()
    soft = -(torch.softmax(topv, -1) * logq.gather(1, topi)).sum(-1).mean()
    return 0.5 * hard + 0.5 * soft


# ---------------------------------------------------------------- held-out agreement

@torch.no_grad()
def heldout_agreement(model, samples: list[dict], hits: Callable[[list[dict]], list[list[bool]]]) -> dict:
    """Top-1 agreement with the target's greedy tokens on the held-out set (full vocabulary), in %,
    per category at depth 1, macro and token-weighted over the benchmark categories (all but
    ShareGPT), and the benchmark macro at each further depth a design predicts.
    hits(part) -> one list per depth of per-label-position hits, in collate's order."""
    model.eval()
    got, counts = [], {}
    for k in range(0, len(samples), 8):
        part = samples[k:k + 8]
        per_depth = hits(part)
        got += [{} for _ in range(len(per_depth) - len(got))]
        o = 0
        for s in part:
            m, c = len(s["ids"]) - s["start"], s["kind"]
            for d, ok in enumerate(per_depth):
                got[d][c] = got[d].get(c, 0) + sum(ok[o:o + m])
            counts[c] = counts.get(c, 0) + m
            o += m
    pct = [{c: 100 * g[c] / counts[c] for c in counts} for g in got]
    out = {c: round(pct[0][c], 1) for c in sorted(counts)}
    bench = [c for c in counts if c != "sharegpt"]
    out["benchmark_macro"] = round(sum(out[c] for c in bench) / max(1, len(bench)), 1)
    out["benchmark_tokens"] = round(100 * sum(got[0][c] for c in bench) / max(1, sum(counts[c] for c in bench)), 1)
    for d in range(1, len(got)):
        out[f"depth{d + 1}_benchmark_macro"] = round(sum(pct[d][c] for c in bench) / max(1, len(bench)), 1)
    model.train()
    return out


# ---------------------------------------------------------------- the loop

def lr_at(design: dict, step: int, seconds: float, plan_seconds: float) -> float:
    """Warm up, then cosine-decay by training TIME (not steps): sessions are time-boxed, and the
    schedule should end near its floor whenever the planned minutes are spent."""
    warm = min(1.0, (step + 1) / 30)
    frac = min(1.0, seconds / plan_seconds)
    return design["lr"] * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def save_checkpoint(path: Path, params: dict, opt, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"trainable": {n: p.detach().clone() for n, p in params.items()},
                "opt": opt.state_dict(), "state": json.dumps(state)}, tmp)
    tmp.replace(path)


def load_checkpoint(path: Path, model, opt) -> dict | None:
    if not path.exists():
        return None
    ck = torch.load(path, weights_only=True)
    model.load_state_dict(ck["trainable"], strict=False)
    opt.load_state_dict(ck["opt"])
    return json.loads(ck["state"])


def load_design(role_dir: Path, fresh: dict) -> dict:
    """A resumed run keeps the design it started with; a new one records `fresh`."""
    role_dir.mkdir(parents=True, exist_ok=True)
    path = role_dir / "design.json"
    if path.exists():
        return json.loads(path.read_text())
    path.write_text(json.dumps(fresh))
    return fresh


@dataclass
class Trainer:
    """One drafter's training state; a design builds it, `train_segment` runs it."""
    name: str                  # the checkpoint directory's name, in the progress bar
    role_dir: Path             # design.json, state.pt, log.jsonl
    design: dict
    model: torch.nn.Module
    params: dict               # name -> trainable parameter
    opt: torch.optim.Optimizer = None
    state: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.opt is None:
            self.opt = torch.optim.AdamW(list(self.params.values()), lr=self.design["lr"], weight_decay=0.01,
                                         betas=(0.9, 0.98))

    @property
    def checkpoint(self) -> Path:
        return self.role_dir / "state.pt"

    @property
    def log(self) -> Path:
        return self.role_dir / "log.jsonl"

    def resume(self, fresh_state: dict, plan_minutes: float | None) -> "Trainer":
        self.state = load_checkpoint(self.checkpoint, self.model, self.opt) or dict(fresh_state)
        self.state["plan_minutes"] = plan_minutes or self.state.get("plan_minutes")
        if not self.state["plan_minutes"]:
            raise SystemExit("--plan-minutes is needed on a fresh run (the learning-rate schedule's length)")
        return self

    def update(self, loss: torch.Tensor) -> None:
        """One optimizer step at the scheduled learning rate."""
        s = self.state
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.design, s["step"], s["seconds"], s["plan_minutes"] * 60)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(self.params.values()), 1.0)
        self.opt.step()
        s["step"] += 1

    def save(self) -> None:
        save_checkpoint(self.checkpoint, self.params, self.opt, self.state)


def train_segment(t: Trainer, work: Callable[[], Iterable[list[float]]], heldout: Callable[[], dict],
                  minutes: float, eval_minutes: float, checkpoint_minutes: float, steps: int | None = None) -> None:
    """Run `work` until `minutes` have passed, `steps` more optimizer steps are done, or SIGTERM comes,
    checkpointing and evaluating on the way. work() does one unit (a batch, and its updates) and yields
    [loss, top-1, (top-1 at depth 2)] after each update; heldout() -> held-out agreement (heldout_agreement)."""
    t_stop = time.time() + minutes * 60
    last = t.state["step"] + steps if steps is not None else None
    t_ck = t_eval = time.time()
    bar = tqdm(total=round(minutes * 60), desc=f"train {t.name}", unit="s", mininterval=30, file=sys.stdout)
    avg = None
    stop = []  # SIGTERM ends the segment after the current unit, with a checkpoint: a kill loses little
    old = signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        while time.time() < t_stop and not stop and (last is None or t.state["step"] < last):
            t0 = time.time()
            for cur in work():
                avg = cur if avg is None else [0.95 * a + 0.05 * c for a, c in zip(avg, cur)]
            dt = time.time() - t0
            t.state["seconds"] += dt
            bar.update(dt)
            if avg is not None:
                bar.set_postfix(loss=f"{avg[0]:.3f}", top1=f"{avg[1]:.3f}", step=t.state["step"], refresh=False)
            if avg is not None and time.time() - t_eval > eval_minutes * 60:
                log_eval(t, avg, heldout())
                t_eval = time.time()
            if time.time() - t_ck > checkpoint_minutes * 60:
                t.save()
                t_ck = time.time()
        t.save()
        bar.close()
        if avg is not None:
            log_eval(t, avg, heldout())
    finally:
        signal.signal(signal.SIGTERM, old)


def log_eval(t: Trainer, avg: list[float], heldout: dict) -> None:
    s = t.state
    log_line(t.log, {"event": "eval", "step": s["step"], **({"epoch": s["epoch"]} if "epoch" in s else {}),
                     "train_minutes": round(s["seconds"] / 60, 1), "loss": round(avg[0], 4),
                     "train_top1": round(100 * avg[1], 1),
                     **({"train_top1_depth2": round(100 * avg[2], 1)} if len(avg) > 2 else {}),
                     "label_tokens_seen": s["label_tokens"], "lr": t.opt.param_groups[0]["lr"], "heldout": heldout})
