"""The bag of input tokens beyond a LoRA adapter's rank (issue 45): ``sparse-tokens`` beside ``lora-tokens`` (the span
test, DAGER's layer-1 test) on the same captures, per cell of family × width × LoRA rank × B × length × scheme.

    python bench/sparse_tokens.py                                   # the default grid (about 20 min on 2 cores)
    python bench/sparse_tokens.py --family llama --width 768 --ranks 16 --batches 8 --lengths 40 150
    python bench/sparse_tokens.py --vocab 128000 --width 768 --ranks 16 --batches 8 --lengths 40 --seeds 1 \\
        --out bench/results/sparse-tokens-v128k   # memory at V = 128k (peak RSS per cell)

Domain: the synthetic clinical notes of scripts/make_text_samples.py (tests/notes_lm.py), tokenised by a byte-level
BPE of ``--vocab`` tokens trained on the notes of generator seeds 1–20 (a vocabulary larger than the notes' own
merges is padded with unused ids, which stay in the dictionary); attacked on notes of seeds 2001+ (new patients,
dates, numbers), each cut to the length of the cell, right-padded.

Models: LLaMA-style (RoPE, RMSNorm, untied) or GPT-2-style (learned positions, tied), 2 blocks, 4 heads, at
``--width``, random weights or ``--train-steps`` Adam steps on the notes. LoRA r on ``--targets`` of every block;
the adapter trained (lora_B drawn N(0, 0.02²), as after earlier rounds: lora_A's gradient is non-zero).
Schemes: FedSGD (the adapter's gradient) and FedAvg (``--steps`` plain SGD steps at η = 0.01 on fresh batches; the
update in float32). Scored against the batch's input tokens (every token but each sequence's last): recall,
precision, seconds, the process's peak RSS so far, and n (distinct first-block inputs) beside (d + rank)/2.
Writes ``--out``.md and .json.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gleak.metrics.tokens import bag_scores, truth_bags  # noqa: E402
from tests.notes_lm import bpe_tokenizer, encode, make_notes  # noqa: E402
from tests.token_models import adapt, lm_loss, run_token_attack, spec_of, text_context  # noqa: E402

LR_CLIENT = 0.01


def base_model(family: str, vocab: int, width: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if family == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=width, n_head=4, vocab_size=vocab, n_positions=320,
                                          bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                          tie_word_embeddings=True)).eval()
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=2 * width,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                        max_position_embeddings=320, tie_word_embeddings=False, bos_token_id=1,
                                        eos_token_id=2, pad_token_id=0)).eval()


def pretrain(model: torch.nn.Module, tok: Any, lines: list[str], steps: int) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=6e-4)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        pick = torch.randint(len(lines), (16,), generator=gen).tolist()
        loss = lm_loss(model, *encode(tok, [lines[i] for i in pick], 48))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def lora_capture(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    start = {n: p.detach().clone() for n, p in params.items()}
    if len(batches) == 1:
        grads = torch.autograd.grad(lm_loss(model, *batches[0]), list(params.values()))
        out = dict(zip(params, (g.detach() for g in grads), strict=True))
    else:
        opt = torch.optim.SGD(list(params.values()), lr=LR_CLIENT)
        for ids, mask in batches:
            opt.zero_grad()
            lm_loss(model, ids, mask).backward()
            opt.step()
        out = {n: p.detach() - start[n] for n, p in params.items()}
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(start[n])
    return {n.replace(".default", ""): t for n, t in out.items()}


def distinct_inputs(family: str, ids: torch.Tensor, mask: torch.Tensor) -> int:
    seen = set()
    for row, m in zip(ids.tolist(), mask.tolist(), strict=True):
        n = sum(m)
        seen.update((t, p) if family == "gpt2" else t for p, t in enumerate(row[:n - 1]))
    return len(seen)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cell(base: torch.nn.Module, model: torch.nn.Module, family: str, tok: Any, pool: list[str], b: int, length: int,
         scheme: str, steps: int, seed: int, vocab: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    count = b * (steps if scheme == "fedavg" else 1)
    pick = torch.randperm(len(pool), generator=gen)[:count].tolist()
    notes = [pool[i] for i in pick]
    batches = [encode(tok, notes[i:i + b], length) for i in range(0, count, b)]
    tensors = lora_capture(model, batches)
    width = max(i.shape[1] for i, _ in batches)
    ids = torch.cat([torch.nn.functional.pad(i, (0, width - i.shape[1])) for i, _ in batches])
    mask = torch.cat([torch.nn.functional.pad(m, (0, width - m.shape[1])) for _, m in batches])
    kind = "update" if scheme == "fedavg" else "gradient"
    spec = spec_of(base, kind, len(batches), LR_CLIENT if kind == "update" else None, batch_size=b, max_length=width)
    ctx = text_context(tensors, spec)
    ctx.model = base
    truth = truth_bags(ids, mask)["inputs"]
    row: dict[str, Any] = {"n": distinct_inputs(family, ids, mask), "tokens": len(truth)}
    for name in ("lora-tokens", "sparse-tokens"):
        start = time.perf_counter()
        result = run_token_attack(name, ctx)
        seconds = time.perf_counter() - start
        entry: dict[str, Any] = {"status": result.status, "seconds": seconds, "peak_mb": peak_mb()}
        out = result.output
        if out is not None and hasattr(out, "bag"):
            s = bag_scores(out.bag(), truth, vocab)
            entry.update(recall=s["recall"], precision=s["precision"],
                         **{k: out.diagnostics.get(k) for k in ("rank", "inputs", "identifiable_below", "trusted")})
        else:
            entry.update(recall=0.0, precision=0.0, reason=result.reason)
        row[name] = entry
    return row


def write(rows: list[dict[str, Any]], args: argparse.Namespace, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    plain = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    out.with_suffix(".json").write_text(json.dumps({"args": plain, "rows": rows}, indent=1))
    lines = [f"# sparse-tokens beside lora-tokens ({args.family}, d = {args.width}, V = {args.vocab}, "
             f"{'random weights' if not args.train_steps else f'{args.train_steps} Adam steps on the notes'}; "
             f"{torch.get_num_threads()} threads)", "",
             "`python bench/sparse_tokens.py " + " ".join(sys.argv[1:]) + "`", "",
             "| r | B | length | scheme | seed | n | (d+rank)/2 | lora-tokens R/P | sparse-tokens R/P | trusted | "
             "seconds | peak RSS MB |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lo, sp = row["lora-tokens"], row["sparse-tokens"]
        bound = sp.get("identifiable_below")
        lines.append(f"| {row['r']} | {row['b']} | {row['length']} | {row['scheme']} | {row['seed']} | {row['n']} | "
                     f"{bound if bound is None else f'{bound:.0f}'} | {lo['recall']:.3f}/{lo['precision']:.3f} | "
                     f"{sp['recall']:.3f}/{sp['precision']:.3f} | {sp.get('trusted', '—')} | {sp['seconds']:.1f} | "
                     f"{sp['peak_mb']:.0f} |")
    failed = [r for r in rows if r["sparse-tokens"]["status"] != "ok"]
    if failed:
        lines += ["", "Refusals (one line each):", ""]
        lines += [f"- r {r['r']}, B {r['b']}, length {r['length']}, {r['scheme']}: {r['sparse-tokens'].get('reason')}"
                  for r in failed]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-len(rows) - 2:]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", choices=["llama", "gpt2"], default="llama")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4000)
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 64])
    p.add_argument("--batches", type=int, nargs="+", default=[8, 16])
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 64])
    p.add_argument("--schemes", nargs="+", default=["fedsgd", "fedavg"])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--targets", default="q_proj,v_proj")
    p.add_argument("--train-steps", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "sparse-tokens")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lines = [n for s in range(1, 21) for n in make_notes(s)]
    tok = bpe_tokenizer(lines, min(args.vocab, 8000))
    base = base_model(args.family, args.vocab, args.width)
    if args.train_steps:
        pretrain(base, tok, lines, args.train_steps)
    pool = [n for s in range(2001, 2011) for n in make_notes(s)]
    long_pool = [" ".join(pool[i:i + 6]) for i in range(0, len(pool) - 6, 6)]  # ~150-300-token documents
    rows = []
    for r in args.ranks:
        model = adapt(base, r, trained=True, seed=1, targets=args.targets.split(","))
        for b in args.batches:
            for length in args.lengths:
                for scheme in args.schemes:
                    for seed in range(args.seeds):
                        row = cell(base, model, args.family, tok, long_pool if length > 64 else pool, b, length,
                                   scheme, args.steps, 100 + seed, args.vocab)
                        row.update(r=r, b=b, length=length, scheme=scheme, seed=seed)
                        rows.append(row)
                        sp = row["sparse-tokens"]
                        print(f"r={r} B={b} len={length} {scheme} seed {seed}: n={row['n']} sparse "
                              f"{sp['recall']:.3f}/{sp['precision']:.3f} {sp['seconds']:.1f}s "
                              f"({sp.get('reason') or sp.get('inputs')})", flush=True)
                        write(rows, args, args.out)


if __name__ == "__main__":
    main()
