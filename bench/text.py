"""DAGER (exact sentence reconstruction; Petrov et al., NeurIPS 2024) on random-weight language models: exact
match, ROUGE over token ids and time, GPT-2-style (tied, learned positions) and LLaMA-style (untied, RoPE), at
GPT-2's width (d = 768) and tiny (d = 128), FedSGD at B = 1…64, short (8–16 tokens) and long (48–64 tokens)
sequences; FedAvg (3 local SGD steps, η = 1e-4 and 1e-3) at B = 8; a trained LoRA adapter (r = 8, 32, 128) at
B = 2, 4; and 3-block sequence classifiers at d = 768 (GPT-2-style at B = 8…64, BERT-style encoder at B = 1…8).

    python bench/text.py --budget 2400            # the full grid (about 25 min on 2 cores)
    python bench/text.py --only gpt2-768-fedsgd   # settings whose name starts with this
    python bench/text.py --from-json              # rewrite text.md and the plots from the saved rows

Models: random weights (tests/token_models.py; nothing downloaded), 2 blocks, 2 heads, n_positions 64, eval mode,
next-token loss over non-pad targets. d = 768: V = 50,257 (GPT-2) and 32,000 (LLaMA); tiny: d = 128, V = 1,000.
Batches: token_batch (random ids in [3, V), lengths uniform in the range, right padding), seed = B (+ 100 for the
long ones). The attack is :func:`gleak.attacks.text.dager.run_dager` exactly as the ``dager`` attack calls it
(head and scale from token_view; LoRA: no head, ``head=None``), timed alone with ``time.perf_counter``.

LoRA: peft LoraConfig(r, lora_alpha = 2r, target c_attn / q,k,v_proj), lora_B drawn N(0, 0.02) as after some
rounds (tests/test_lora_tokens.py ``adapt``), the adapter's FedSGD gradient as the capture. run_dager gets the base
model and the global adapter (``stored_adapter`` = its config and tensors, as the ``dager`` attack reads them beside
the capture), which it merges for the second-block inputs; the ``-base`` rows give no global adapter.

Scores: :func:`gleak.metrics.text.text_scores` (token-id ROUGE, Hungarian matching, chance by 5 seeded draws).
n = the distinct inputs the span must hold, max(n₁, n₂): n₁ distinct first-block inputs (GPT-2: (token, position)
pairs; LLaMA: tokens) and n₂ distinct prefixes (second-block inputs), over the loss-relevant positions (every
position but each sequence's last). The span test needs n below the width less a margin (d − 20 at 768, d − 16 at
128) or below r (LoRA); beyond it the attack refuses ("refused: rank").

A setting whose predicted time (the same family's last time × its measured growth from the batch size before, or
×(B'/B)³ for LLaMA and ×(B'/B)² for GPT-2 while times are under 5 s, ×B'/B after one slower row) exceeds
``--max-predicted`` seconds is skipped and listed; each run is also cut by an alarm at ``--timeout`` seconds. Rows
are appended to ``--rows`` (JSON lines) as they finish.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gleak.attacks.text.dager import run_dager  # noqa: E402
from gleak.attacks.tokens.spantest import margin  # noqa: E402
from gleak.attacks.tokens.view import token_view  # noqa: E402
from gleak.capture import model_logits, token_loss  # noqa: E402
from gleak.errors import GleakError  # noqa: E402
from gleak.metrics.text import text_scores  # noqa: E402
from tests.token_models import adapt, fedavg_update, gpt2, gradient, llama, lm_loss, spec_of, token_batch  # noqa: E402

SHORT, LONG = (8, 16), (48, 64)
WIDE = {"gpt2": (768, 50_257), "llama": (768, 32_000)}
TINY = {"gpt2": (128, 1_000), "llama": (128, 1_000)}
BATCHES = (1, 2, 4, 8, 16, 32, 64)
# long sequences at d = 768: GPT-2 tests all 64 positions of V = 50,257 in layer 1 (about 2.5 min whatever B), so
# only B = 1 and 8 run there (16 and 32 are refused before layer 1); LLaMA's assembly grows as B³
LONG_768 = {"gpt2": (1, 8, 16, 32), "llama": (1, 2, 4, 8, 16)}
# sequence classifiers (DAGER's main setting): GPT-2-style decoder and BERT-style encoder, 3 blocks (a classifier's
# last block sees the other positions only through the pooled one, so the second block must not be the last)
CLASSIFIERS = {"gpt2cls": ((768, 50_257), (8, 16, 32, 64)), "bert": ((768, 30_522), (1, 2, 4, 8))}


def settings() -> list[dict[str, Any]]:
    """The grid, in the order it runs (cheap first within a family, so the time prediction has a base)."""
    out: list[dict[str, Any]] = []
    for family in ("gpt2", "llama"):
        for size, table in (("768", WIDE), ("tiny", TINY)):
            d, v = table[family]
            long = BATCHES if size == "tiny" else LONG_768[family]
            for name, lengths, batches in (("short", SHORT, BATCHES), ("long", LONG, long)):
                for b in batches:
                    out.append({"name": f"{family}-{size}-fedsgd-{name}-B{b}", "family": family, "size": size,
                                "d": d, "V": v, "setting": "fedsgd", "lengths": lengths, "B": b})
            for lr in (1e-4, 1e-3):
                out.append({"name": f"{family}-{size}-fedavg-lr{lr:g}-B8", "family": family, "size": size, "d": d,
                            "V": v, "setting": "fedavg", "lengths": SHORT, "B": 8, "lr": lr, "steps": 3,
                            "dtype": "float32"})
                # the same in float64, as DAGER's FedAvg code runs (METHODS-text §3.10)
                out.append({"name": f"{family}-{size}-fedavg-lr{lr:g}-B8-f64", "family": family, "size": size,
                            "d": d, "V": v, "setting": "fedavg", "lengths": SHORT, "B": 8, "lr": lr, "steps": 3,
                            "dtype": "float64"})
        d, v = WIDE[family]
        for r in (8, 32, 128):
            for b in (2, 4):
                out.append({"name": f"{family}-768-lora-r{r}-B{b}", "family": family, "size": "768", "d": d, "V": v,
                            "setting": "lora", "lengths": SHORT, "B": b, "r": r, "model": "global"})
        d, v = TINY[family]
        out.append({"name": f"{family}-tiny-lora-r32-B2-base", "family": family, "size": "tiny", "d": d, "V": v,
                    "setting": "lora", "lengths": SHORT, "B": 2, "r": 32, "model": "none"})
        out.append({"name": f"{family}-tiny-lora-r32-B2", "family": family, "size": "tiny", "d": d, "V": v,
                    "setting": "lora", "lengths": SHORT, "B": 2, "r": 32, "model": "global"})
    for family, ((d, v), batches) in CLASSIFIERS.items():
        for b in batches:
            out.append({"name": f"{family}-768-classify-B{b}", "family": family, "size": "768", "d": d, "V": v,
                        "setting": "classify", "lengths": SHORT, "B": b})
    # cheap first, so that a grid cut by --budget loses the slowest rows: tiny, LoRA, FedAvg, d = 768 short, long
    def rank(x: dict[str, Any]) -> int:
        if x["size"] == "tiny":
            return 0
        if x["setting"] != "fedsgd":
            return 1 if x["setting"] == "lora" else 2
        return 3 if x["lengths"] == SHORT else 4

    return sorted(out, key=rank)


def seed_of(s: dict[str, Any]) -> int:
    return int(s["B"]) + (100 if s["lengths"] == LONG else 0)


def counts(ids: torch.Tensor, mask: torch.Tensor, family: str, classify: bool = False) -> dict[str, int]:
    """M loss-relevant positions, distinct tokens there, n₁ (first-block inputs), n₂ (prefixes; an encoder's every
    position, each reading the whole sequence). A classifier's loss reads every position, the last too."""
    tokens: set[int] = set()
    firsts: set[tuple[int, ...]] = set()
    prefixes: set[tuple[int, ...]] = set()
    m = 0
    for row, keep in zip(ids.tolist(), mask.tolist(), strict=True):
        seq = [t for t, k in zip(row, keep, strict=True) if k]
        for p, t in enumerate(seq if classify else seq[:-1]):
            m += 1
            tokens.add(t)
            firsts.add((t, p) if family != "llama" else (t,))
            prefixes.add(tuple(seq[:p + 1]) if family != "bert" else (*seq, p))
    return {"M": m, "distinct_tokens": len(tokens), "n1": len(firsts), "n2": len(prefixes),
            "n": max(len(firsts), len(prefixes))}


def classifier(family: str, d: int, vocab: int) -> torch.nn.Module:
    """A random 3-block sequence classifier (2 classes, 2 heads, 64 positions), eval mode."""
    import transformers

    torch.manual_seed(0)
    if family == "bert":
        return transformers.BertForSequenceClassification(transformers.BertConfig(
            vocab_size=vocab, hidden_size=d, intermediate_size=4 * d, num_hidden_layers=3, num_attention_heads=2,
            max_position_embeddings=64, pad_token_id=0, num_labels=2)).eval()
    return transformers.GPT2ForSequenceClassification(transformers.GPT2Config(
        n_layer=3, n_embd=d, n_head=2, vocab_size=vocab, n_positions=64, pad_token_id=0, num_labels=2)).eval()


def lora_gradient(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    grads = torch.autograd.grad(lm_loss(model, ids, mask), list(params.values()))
    return {n.replace(".default", ""): g.detach() for n, g in zip(params, grads, strict=True)}


class Timeout(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise Timeout


def status_of(error: GleakError) -> str:
    text = str(error)
    if "no clear rank" in text:
        return "refused: no clear rank gap"
    if "does not separate" in text:
        return "refused: prefixes not separated"
    if "distinct inputs there" in text:
        return "refused: rank"
    return "failed: " + text[:160]


def one(s: dict[str, Any], models: dict[tuple[str, str], torch.nn.Module], timeout: int) -> dict[str, Any]:
    family, b = s["family"], int(s["B"])
    key = (family, s["size"])
    if key not in models:
        models.clear()
        models[key] = classifier(family, s["d"], s["V"]) if s["setting"] == "classify" else \
            (gpt2 if family == "gpt2" else llama)(d=s["d"], vocab=s["V"], layers=2)
    base = models[key]
    ids, mask = token_batch(b, s["V"], s["lengths"], seed_of(s))
    length = int(ids.shape[1])
    row: dict[str, Any] = {k: v for k, v in s.items() if k != "lengths"}
    row["lengths"] = f"{s['lengths'][0]}–{s['lengths'][1]}"
    row.update(counts(ids, mask, family, s["setting"] == "classify"))
    truth = [[int(t) for t, k in zip(r, m, strict=True) if k] for r, m in zip(ids.tolist(), mask.tolist(),
                                                                                strict=True)]
    head: torch.Tensor | None = None
    scale = 1.0
    model = base
    stored: tuple[dict[str, Any], dict[str, torch.Tensor]] | None = None
    if s["setting"] == "lora":
        peft_model = adapt(base, int(s["r"]), trained=True)
        tensors = lora_gradient(peft_model, ids, mask)
        spec = spec_of(base, batch_size=b, max_length=length)
        if s["model"] == "global":  # what the server sent: the adapter's config and weights, named as peft saves
            stored = ({"r": int(s["r"]), "lora_alpha": 2 * int(s["r"])},
                      {n.replace(".default", ""): p.detach().clone() for n, p in peft_model.named_parameters()
                       if "lora_" in n})
    elif s["setting"] == "classify":
        base.zero_grad()
        token_loss(model_logits(base(input_ids=ids, attention_mask=mask)), ids, mask, torch.arange(b) % 2,
                   "sequence_classification").backward()
        tensors = {n: p.grad.detach().clone() for n, p in base.named_parameters() if p.grad is not None}
        spec = dataclasses.replace(spec_of(base, batch_size=b, max_length=length), task="sequence_classification")
    else:
        if s["setting"] == "fedsgd":
            tensors = gradient(base, ids, mask)
            spec = spec_of(base, batch_size=b, max_length=length)
        else:
            if s["dtype"] == "float64":
                model = base = copy.deepcopy(base).double()
            tensors = fedavg_update(base, ids, mask, int(s["steps"]), float(s["lr"]))
            spec = spec_of(base, "update", int(s["steps"]), float(s["lr"]), batch_size=b, max_length=length)
        view = token_view(tensors, spec)
        head = view.head if view.head is not None else view.embedding
        scale = view.scale
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    start = time.perf_counter()
    try:
        found = run_dager(model, spec, tensors, head=head, head_scale=scale, stored_adapter=stored,
                          missing_global="no global adapter in this bench", min_gap=100.0)
        row["status"] = "ok"
        row["warnings"] = found.warnings
    except GleakError as e:
        found = None
        row["status"] = status_of(e)
        room = (s["d"] - margin(s["d"])) if s["setting"] != "lora" else int(s["r"])
        if row["status"] == "refused: rank" and row["n"] < room:  # the rank is full, yet the batch has fewer inputs
            row["status"] = f"refused: rank (full rank from noise: n = {row['n']} < {room})"
    except Timeout:
        found = None
        row["status"] = f"timeout (> {timeout} s)"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    row["seconds"] = time.perf_counter() - start
    scored = text_scores(found.sequences if found is not None else [], truth, vocab_size=s["V"])
    for k in ("rouge1", "rouge2", "rougeL", "exact_match", "exact_up_to_last", "token_accuracy", "chance_rouge1",
              "bag_only_rouge2"):
        row[k] = scored[k]
    if found is not None:
        dg = found.diagnostics
        row.update({"found": len(found.sequences), "flagged_exact": sum(found.exact),
                    "rank1": dg["span1"].get("rank"), "rank2": dg["span2"].get("rank"),
                    "frontier_cut": bool(dg.get("frontier_cut_at")),
                    "search": sorted(set(dg.get("lengths_searched", {}).values())),
                    "last": dg.get("last_tokens", "none"),
                    "tau1_from": dg["tau1_from"]})
    return row


def predicted(s: dict[str, Any], done: list[dict[str, Any]]) -> float | None:
    """Seconds predicted from the last two ok rows of the same family, size, setting and lengths."""
    same = [r for r in done if r["family"] == s["family"] and r["size"] == s["size"] and r["setting"] == "fedsgd"
            and s["setting"] == "fedsgd" and r["lengths"] == f"{s['lengths'][0]}–{s['lengths'][1]}"
            and r["status"] == "ok"]
    if not same:
        return None
    last = same[-1]
    doublings = math.log2(s["B"] / last["B"])
    if len(same) >= 2 and same[-2]["seconds"] > 1.0:  # the measured growth per doubling of B
        growth = max(1.0, last["seconds"] / same[-2]["seconds"])
        factor = growth ** (doublings / math.log2(last["B"] / same[-2]["B"]))
    elif last["seconds"] < 5.0:
        factor = 2.0 ** (doublings * (3 if s["family"] == "llama" else 2))
    else:  # one slow row: mostly the fixed layer-1 pass over the vocabulary, taken to grow linearly
        factor = 2.0 ** doublings
    return float(last["seconds"] * factor)


def run_grid(args: argparse.Namespace) -> None:
    from transformers.utils import logging

    logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    import warnings

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    args.rows.parent.mkdir(parents=True, exist_ok=True)
    done: list[dict[str, Any]] = []
    models: dict[tuple[str, str], torch.nn.Module] = {}
    started = time.perf_counter()
    for s in settings():
        if args.only and not any(s["name"].startswith(o) for o in args.only):
            continue
        ids, mask = token_batch(int(s["B"]), s["V"], s["lengths"], seed_of(s))
        c = counts(ids, mask, s["family"], s["setting"] == "classify")
        room = (s["d"] - margin(s["d"])) if s["setting"] != "lora" else int(s["r"])
        guess = predicted(s, done)
        if c["n"] < room and guess is not None and guess > args.max_predicted:
            row = {k: v for k, v in s.items() if k != "lengths"}
            row.update(c, lengths=f"{s['lengths'][0]}–{s['lengths'][1]}",
                       status=f"skipped: predicted {guess:.0f} s > {args.max_predicted:.0f} s", seconds=None)
        elif time.perf_counter() - started > args.budget:
            row = {k: v for k, v in s.items() if k != "lengths"}
            row.update(c, lengths=f"{s['lengths'][0]}–{s['lengths'][1]}",
                       status=f"skipped: grid budget {args.budget:.0f} s spent", seconds=None)
        else:
            row = one(s, models, args.timeout)
        row["threads"] = args.threads
        done.append(row)
        print(json.dumps({k: row.get(k) for k in ("name", "n", "status", "exact_match", "exact_up_to_last",
                                                  "rouge1", "seconds")}), flush=True)
        with args.rows.open("a") as f:
            f.write(json.dumps(row) + "\n")


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The saved rows, the last one of each name kept, in grid order."""
    rows: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            rows[r["name"]] = r
    order = [s["name"] for s in settings()]
    return [rows[n] for n in order if n in rows]


def pct(x: Any) -> str:
    return "—" if x is None else f"{100 * float(x):.1f}"


def secs(x: Any) -> str:
    return "—" if x is None else f"{float(x):.1f}"


COLUMNS = ["lengths", "M", "distinct tokens", "n", "n/d", "exact", "exact ≤ last", "ROUGE-1", "ROUGE-2", "ROUGE-L",
           "token acc.", "chance R-1", "s", "status"]


MEAN_COLUMNS = ("exact_match", "exact_up_to_last", "rouge1", "rouge2", "rougeL", "token_accuracy", "chance_rouge1")


def header(lead: list[str]) -> list[str]:
    cols = [*lead, *COLUMNS]
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def line(r: dict[str, Any], lead: list[str]) -> str:
    room = r["d"] if r["setting"] != "lora" else r["r"]
    if not (r["status"] == "ok" or r["status"].startswith("refused")):  # timed out or skipped: no score
        r = {k: v for k, v in r.items() if k not in MEAN_COLUMNS}
    cells = [*lead, r["lengths"], str(r["M"]), str(r["distinct_tokens"]), str(r["n"]), f"{r['n'] / room:.2f}",
                    pct(r.get("exact_match")), pct(r.get("exact_up_to_last")), pct(r.get("rouge1")),
                    pct(r.get("rouge2")), pct(r.get("rougeL")), pct(r.get("token_accuracy")),
                    pct(r.get("chance_rouge1")), secs(r.get("seconds")), r["status"]]
    return "| " + " | ".join(cells) + " |"


def table(rows: list[dict[str, Any]], lead: list[str], cells: Any) -> list[str]:
    """A table of ``rows``: the ``lead`` columns (``cells(row)``) before the shared ones."""
    return header(lead) + [line(r, cells(r)) for r in rows]


def plots(rows: list[dict[str, Any]], out: Path) -> list[tuple[str, str, str]]:
    """(file, title, alt text) of the two figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    styles = {("gpt2", "768"): ("tab:blue", "o"), ("gpt2", "tiny"): ("tab:cyan", "s"),
              ("llama", "768"): ("tab:red", "^"), ("llama", "tiny"): ("tab:orange", "v")}
    for ax, metric, label in ((axes[0], "exact_match", "exact match"), (axes[1], "rouge1", "ROUGE-1 (token ids)")):
        for (family, size), (color, marker) in styles.items():
            for lengths, fill in (("8–16", True), ("48–64", False)):
                # measured rows only (ok or refused); a timed-out or skipped setting has no score
                pts = sorted((r["n"] / r["d"], 0.0 if r["status"].startswith("refused") else float(r[metric]))
                             for r in rows if r["setting"] == "fedsgd" and r["family"] == family
                             and r["size"] == size and r["lengths"] == lengths and r.get(metric) is not None
                             and (r["status"] == "ok" or r["status"].startswith("refused")))
                if not pts:
                    continue
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, color=color, marker=marker, markerfacecolor=color if fill else "white",
                        linestyle="none", markersize=7 if fill else 9, alpha=0.85,
                        label=f"{family} d={768 if size == '768' else 128}, {lengths} tok")
        for d, style in ((768, ":"), (128, "-.")):
            ax.axvline((d - margin(d)) / d, color="grey", linestyle=style, linewidth=1)
        ax.axvspan(1.0, 40.0, color="grey", alpha=0.12, linewidth=0)
        ax.text(1.15, 0.5, "span saturated:\nrefused (rank)", ha="left", va="center", fontsize=8, color="dimgrey",
                transform=ax.get_xaxis_transform())
        ax.text(0.86, 0.62, "(d − margin)/d:\n-. d=128, : d=768", ha="right", va="center", fontsize=7,
                color="dimgrey", transform=ax.get_xaxis_transform())
        ax.set_xlim(0.01, 40)
        ax.set_xscale("log")
        ax.set_xlabel("n / d (distinct inputs the span must hold / width)")
        ax.set_title(label)
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("score (refused = 0)")
    axes[1].legend(fontsize=7, loc="lower left")
    title = "DAGER on random-weight decoders (2 blocks, FedSGD): exact match and ROUGE-1 against n/d"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = out.parent / "text_nd.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    made.append((path.name, title,
                 "Two panels, exact match (left) and token-id ROUGE-1 (right) against n/d on a log axis, one marker "
                 "series per model family, width and sequence length (filled: 8–16 tokens, open: 48–64): every "
                 "measured batch below the saturation lines at (d − margin)/d scores 1, every batch beyond them is "
                 "refused and scores 0; timed-out and skipped settings are not drawn."))
    fig, ax = plt.subplots(figsize=(6, 4))
    for family, color in (("gpt2", "tab:blue"), ("llama", "tab:red")):
        for b, marker in ((2, "o"), (4, "s")):
            pts = sorted((r["r"], float(r["rouge1"])) for r in rows
                         if r["setting"] == "lora" and r["family"] == family and r["B"] == b
                         and r["size"] == "768" and r.get("model") == "global" and r.get("rouge1") is not None)
            if pts:
                xs, ys = zip(*pts, strict=True)
                big = family == "gpt2"  # the two families score the same: GPT-2 drawn open and larger
                ax.plot(xs, ys, color=color, marker=marker, linestyle="-" if b == 2 else "--",
                        markersize=12 if big else 6, markerfacecolor="white" if big else color,
                        linewidth=3 if big else 1.2, alpha=0.8, label=f"{family} d=768, B={b}")
    for n, b in ((20, 2), (41, 4)):
        ax.axvline(n, color="grey", linestyle=":" if b == 2 else "-.", linewidth=1)
        ax.text(n * 1.05, 0.45 if b == 2 else 0.3, f"n = {n}\n(B = {b})", fontsize=7, color="dimgrey")
    ax.set_xscale("log", base=2)
    ax.set_xticks([8, 32, 128], ["8", "32", "128"])
    ax.set_xlabel("LoRA rank r")
    ax.set_ylabel("ROUGE-1 (token ids; refused = 0)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    title = "DAGER on a trained LoRA adapter (no head gradient): ROUGE-1 against rank r"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = out.parent / "text_lora.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    made.append((path.name, title,
                 "ROUGE-1 against LoRA rank r (8, 32, 128) for GPT-2-style and LLaMA-style models at d = 768, "
                 "B = 2 and 4, with the batch's n (20 and 41) marked: the attack refuses (0) while n reaches r and "
                 "recovers all but each sequence's last token (ROUGE-1 about 0.95) once r exceeds n; both families "
                 "give the same numbers, so their lines coincide."))
    return made


def write(rows: list[dict[str, Any]], out: Path) -> None:
    load = os.getloadavg()
    threads = sorted({r.get("threads", 1) for r in rows})
    figs = plots(rows, out)
    lines = ["# DAGER on random-weight language models (bench/text.py)", "",
             f"CPU, torch threads = {', '.join(map(str, threads))}, {os.cpu_count()} cores (load average "
             f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} over 1 / 5 / 15 min when written): the seconds are "
             "upper bounds and only roughly comparable between rows.", "",
             "**Caveat before comparing with the paper.** Ours: random-weight models with 2 blocks and 2 heads "
             "(tests/token_models.py; the classifiers 3 blocks), random token ids (no language), ROUGE over token "
             "ids (no words, no stemming; gleak.metrics.text), one batch per row (no 100-batch mean, no interval). "
             "DAGER's numbers: pretrained "
             "GPT-2 (12 blocks) and LLaMA-2 7B on CoLA / SST-2 / Rotten Tomatoes, ROUGE over words, 100 batches, "
             "GPUs. Random weights are the easy case for the span test (no near-duplicate inputs), and 2 blocks are "
             "all DAGER reads anyway; natural text repeats tokens and prefixes, so n is smaller for the same B.", "",
             "Columns: M = loss-relevant positions (every position but each sequence's last); distinct tokens among "
             "them; n = max(n₁, n₂), the distinct first-block inputs (GPT-2: (token, position) pairs, LLaMA: "
             "tokens) or distinct prefixes (second-block inputs), whichever is larger; n/d relative to the width (r "
             "for LoRA). exact = identical id sequence; exact ≤ last = all but the last token in place (the last "
             "token is in no span under next-token loss; DAGER takes it from the LM head, which a LoRA capture does "
             "not have); ROUGE-1/2/L F1 and token accuracy ×100 after a Hungarian matching; chance R-1 = random ids "
             "of the true lengths. s = run_dager alone. status: ok; refused: rank (the span fills the width less "
             "the margin, or r: the one-line saturation message, expected beyond the rank); skipped (predicted "
             "time above 3 min on these cores).", ""]
    by = {r["name"]: r for r in rows}

    def say(name: str) -> str:
        r = by.get(name)
        if r is None:
            return "not run"
        if r["status"] != "ok":
            return str(r["status"])
        return (f"exact {pct(r['exact_match'])}, exact ≤ last {pct(r['exact_up_to_last'])}, ROUGE-1 "
                f"{pct(r['rouge1'])}, {secs(r['seconds'])} s")

    lines += ["## Summary", "",
              f"- FedSGD, B = 8, d = 768: GPT-2-style {say('gpt2-768-fedsgd-short-B8')}; LLaMA-style "
              f"{say('llama-768-fedsgd-short-B8')}. B = 16: GPT-2 {say('gpt2-768-fedsgd-short-B16')}; LLaMA "
              f"{say('llama-768-fedsgd-short-B16')}. GPT-2 B = 32: {say('gpt2-768-fedsgd-short-B32')}; B = 64: "
              f"{say('gpt2-768-fedsgd-short-B64')}. Long sequences (48–64 tokens), B = 8: GPT-2 "
              f"{say('gpt2-768-fedsgd-long-B8')}; LLaMA {say('llama-768-fedsgd-long-B8')}.",
              "- FedSGD: every batch with n below the width less the margin was recovered exactly (both families, "
              "both widths, short and long sequences; the tied GPT-2 head gave every last token); every batch beyond "
              "it was refused in well under a second (\"refused: rank\"), never answered with a wrong guess. The "
              "prefix test runs each candidate as one token on the prefixes' cached first block (before: each "
              "candidate's whole prefix again, about 10 min for GPT-2 B = 64 and an estimated 100 min for GPT-2 B = 8 "
              "long), and the first-block residuals are screened in float32.",
              f"- Sequence classifiers (3 blocks, every token in the spans, no head needed): GPT-2-style B = 8 "
              f"{say('gpt2cls-768-classify-B8')}, B = 32 {say('gpt2cls-768-classify-B32')}; BERT-style encoder (the "
              f"paper's Alg. 3 search) B = 1 {say('bert-768-classify-B1')}, B = 4 {say('bert-768-classify-B4')}, "
              f"B = 8 {say('bert-768-classify-B8')}.",
              f"- LoRA (trained adapter, no head): r = 128, B = 2: {say('gpt2-768-lora-r128-B2')} (GPT-2), "
              f"{say('llama-768-lora-r128-B2')} (LLaMA); r = 8, B = 4: {say('gpt2-768-lora-r8-B4')} (n = 41 > r). "
              "Without the global adapter (base model only) no prefix passes the second block and the attack says "
              "so in one line.",
              f"- FedAvg (3 SGD steps, B = 8, float32 as a client sends it): GPT-2 d = 768, η = 1e-4: "
              f"{say('gpt2-768-fedavg-lr0.0001-B8')}; LLaMA d = 768, η = 1e-4: "
              f"{say('llama-768-fedavg-lr0.0001-B8')}, η = 1e-3: {say('llama-768-fedavg-lr0.001-B8')}; in float64 "
              f"LLaMA η = 1e-4: {say('llama-768-fedavg-lr0.0001-B8-f64')}.",
              ""]
    published = {
        "gpt2": ["Published (DAGER Table 2–3, pretrained GPT-2 base, d = 768, ROUGE-1 / ROUGE-2 over words): "
                 "B = 1–8: 100 / 100 on CoLA and RT (RT B = 4: 99.3 / 99.3); B = 32: CoLA 100 / 100, SST-2 "
                 "100 / 93.4, RT 98.0 / 97.8; B = 64: CoLA 100 / 100, SST-2 92.9 / 85.0, RT 2.8 / 1.1 (RT's ~20 "
                 "tokens per sequence exceed the rank); B = 128: CoLA 30.3 / 14.6 (best effort at full rank), RT "
                 "0 / 0. GPT-2 next-token, RT: 99.9 / 99.7 at B = 16."],
        "llama": ["Published (DAGER Table 3, LLaMA-2 7B, d = 4096): ROUGE-1 / ROUGE-2 ≥ 97.8 / 97.8 for every B from "
                  "16 to 128 on CoLA, SST-2 and RT (e.g. RT B = 64: 97.9 / 97.8; CoLA B = 128: 99.5 / 99.3). Our "
                  "LLaMA-style model is 5.3× narrower (d = 768), so it saturates at a 5.3× smaller n."],
    }
    for family, title in (("gpt2", "GPT-2-style (tied embeddings, learned positions)"),
                          ("llama", "LLaMA-style (untied head, RoPE, RMSNorm)")):
        for size in ("768", "tiny"):
            chosen = [r for r in rows if r["family"] == family and r["size"] == size and r["setting"] == "fedsgd"]
            if not chosen:
                continue
            d, v = chosen[0]["d"], chosen[0]["V"]
            lines += [f"## {title}, d = {d}, V = {v:,}: FedSGD", ""]
            if size == "768":
                lines += published[family] + [""]
            lines += header(["B"]) + [line(r, [str(r["B"])]) for r in chosen] + [""]
    classified = [r for r in rows if r["setting"] == "classify"]
    if classified:
        lines += ["## Sequence classifiers: 3 blocks, d = 768, FedSGD, lengths 8–16", "",
                  "DAGER's main setting: a classifier (2 classes here) whose pooled position reads every token, so "
                  "every token, the last included, lies in the spans; M counts every position, and for the encoder "
                  "n counts every position (each reads the whole sequence). GPT-2-style decoders (V = 50,257) use "
                  "the prefix assembly; the BERT-style encoder (V = 30,522) the paper's whole-sequence search "
                  "(exhaustive up to 20,000 candidates per length, a coordinate search beyond). Published (DAGER "
                  "Table 2, pretrained BERT base): B = 1: 100 / 100; B = 4: CoLA 94.0 / 89.9, RT 66.8 / 50.1; B = 8: "
                  "ROUGE-1 CoLA 67.8, RT 37.1 (about 2 h per batch on an L4 for RT at B = 8). GPT-2 as in the "
                  "tables above.", "",
                  *table(classified, ["model", "B"], lambda r: [
                      "GPT-2 classifier" if r["family"] == "gpt2cls" else "BERT classifier", str(r["B"])]), ""]
    fedavg = [r for r in rows if r["setting"] == "fedavg"]
    if fedavg:
        lines += ["## FedAvg: 3 local SGD steps on the batch, B = 8, lengths 8–16", "",
                  "The update Δ = θ₃ − θ₀ is the capture (spec kind = update, 3 steps, the η given); candidates are "
                  "computed at θ₀. Published (DAGER Table 4, GPT-2, RT, B = 16, E = 10 epochs, mini-batch 4, "
                  "ROUGE-1 / ROUGE-2): η = 1e-4 (default) about 96–98 (E = 2: 98.4 / 98.0; E = 20: 96.0 / 95.3); "
                  "η = 1e-5: 100 / 99.8; η = 5e-4: 84.2 / 82.2 (the learning rate drives failure). Their code also "
                  "raises the rank by 60 and works in float64. Here: the update as a float32 client sends it, and "
                  "the same client in float64 (model and update), run_dager unmodified.", "",
                  "What the float32 rows show: Δ = θ₃ − θ₀ is a difference of two float32 weights, so each entry "
                  "carries rounding of about 6e-8·|θ| next to a signal of about η·|∇|. Where the batch's n "
                  "directions stand clear of that floor (GPT-2 d = 768; LLaMA d = 768 at η = 1e-3), the update is "
                  "read exactly, as the gradient is. Where they do not (tiny GPT-2, η = 1e-4: s₈₇ only about 4× the "
                  "floor; LLaMA at η = 1e-4), the attack refuses in one line: the spectrum runs into the rounding "
                  "floor (the message estimates it from the weights' size and the steps) or the prefix test passes "
                  "more than 8·B prefixes at three positions in a row (\"prefixes not separated\"). In float64 the "
                  "span is clean. Tiny GPT-2 at η = 1e-3 in float64 is refused at full rank: its tied embedding "
                  "itself moves over the 3 steps, so the update holds up to 3n slightly moved inputs "
                  "(METHODS-text §3.10 caveat), more than d = 128 holds.", "",
                  *table(fedavg, ["model", "η", "dtype", "B"], lambda r: [
                      f"{r['family']} d={r['d']}", f"{r['lr']:g}", r["dtype"], str(r["B"])])]
    lora = [r for r in rows if r["setting"] == "lora"]
    if lora:
        lines += ["", "## LoRA: a trained adapter's FedSGD gradient, lengths 8–16", "",
                  "peft LoRA on c_attn (GPT-2) or q/k/v_proj (LLaMA), α = 2r, lora_B ~ N(0, 0.02); the capture holds "
                  "only lora_A / lora_B gradients, so there is no head gradient (head = None) and the last token of "
                  "each sequence is not recovered: compare exact ≤ last. n/d here is n/r. global adapter = "
                  "run_dager given the base model and the global adapter (config and tensors, as the `dager` attack "
                  "reads them from NAME.adapter/ beside the capture; it merges them for the second-block inputs); "
                  "none = the base model alone. Published (DAGER "
                  "Table 11, LLaMA-3.1 8B, LoRA on q_proj, r = 256, RT, the adapter first trained 3 epochs at batch "
                  "4): ROUGE-1 94.8, ROUGE-2 94.2 ± 0.7. Our ROUGE-1 of 94.8 at B = 2 is a coincidence of the "
                  "lengths: every token but the last is recovered in place (exact ≤ last = 100), and a reference "
                  "of L tokens scores 2(L − 1)/(2L − 1).", "",
                  "Without the global adapter the attack fails in one line (\"no prefix passed the second-block span "
                  "test … or a LoRA update read without its global adapter\"): the candidates' second-block inputs "
                  "miss the first block's adapter, so no prefix lies in the second-block span.", "",
                  *table(lora, ["model", "r", "B", "global adapter"], lambda r: [
                      f"{r['family']} d={r['d']}", str(r["r"]), str(r["B"]),
                      "given" if r["model"] == "global" else "none"])]
    skipped = [r for r in rows if r["status"].startswith(("skipped", "timeout"))]
    names = {r["name"] for r in rows}
    absent = [x["name"] for x in settings() if x["name"] not in names]
    lines += ["", "## Not run, cut, or timed out", "",
              "The whole grid ran in one pass (`python bench/text.py --budget 2400`), one torch thread on 2 cores; "
              "settings predicted over 3 min are skipped and listed here. gpt2-768-fedsgd-long-B8 was predicted at "
              "198 s (×B from the B = 1 row, most of which is the fixed 64-position first-block pass) and run on "
              "its own right after (`--only gpt2-768-fedsgd-long-B8 --max-predicted 100000`).", ""]
    lines += [f"- {r['name']} (n = {r['n']}): {r['status']}" for r in skipped]
    lines += [f"- {n}: not run (grid cut for time)" for n in absent]
    lines += ["", "## Figures", ""]
    for name, title, alt in figs:
        lines += [f"**{title}**", "", f"![{alt}]({name})", ""]
    out.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=[], help="run only settings whose name starts with one of these")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 on shared cores)")
    parser.add_argument("--timeout", type=int, default=240, help="seconds before one run is cut")
    parser.add_argument("--max-predicted", type=float, default=180.0, help="skip a setting predicted to take longer")
    parser.add_argument("--budget", type=float, default=1500.0, help="seconds of grid; later settings are skipped")
    parser.add_argument("--rows", type=Path, default=Path("/tmp/gleak-bench/text_rows.jsonl"))
    parser.add_argument("--from-json", action="store_true", help="only rewrite the results from --rows")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "text.md")
    args = parser.parse_args()
    if not args.from_json:
        run_grid(args)
    write(load_rows(args.rows), args.out)


if __name__ == "__main__":
    main()
