"""``gleak labels`` end to end on a language model's capture at vocabulary 50,257: peak RSS and wall time.

    python bench/tokens_cli.py                    # build (once, cached under /tmp), simulate, 3 timed runs
    python bench/tokens_cli.py --runs 5 --layers 2

What it does:

1. Builds, once, a GPT-2-style Hugging Face folder under ``--cache`` (default /tmp/gleak-bench/gpt2-50257): random
   weights (d = 768, ``--layers`` blocks, 12 heads, n_positions 1024, tied embeddings) saved with
   ``save_pretrained``, and a byte-level BPE tokenizer of exactly 50,257 tokens trained with ``tokenizers`` on the
   synthetic notes of scripts/make_text_samples.py plus pseudo-words (the notes alone do not hold 50,257 merges).
2. Writes held-out notes (a generator seed the tokenizer never saw) and makes the capture with
   ``gleak simulate --model DIR --data FILE --batch-size 8 --max-length 32`` (FedSGD, one gradient).
3. Runs ``gleak labels CAPTURE --model DIR --format json`` ``--runs`` times under ``/usr/bin/time -v`` and reports
   min / median of "Maximum resident set size" and of the wall time, the thread count the report states, and
   the token-bag result. Nothing is downloaded. Writes bench/results/tokens_cli.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
V, D = 50_257, 768


def notes_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_text_samples", ROOT / "scripts" / "make_text_samples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pseudo_words(n: int, seed: int) -> list[str]:
    """``n`` lines of random lowercase words: enough distinct byte pairs for 50k BPE merges."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [" ".join("".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(12))
            for _ in range(n)]


def build_folder(folder: Path, layers: int) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    transformers.utils.logging.disable_progress_bar()
    make_notes = notes_module().make_notes
    texts = [line for seed in range(1, 11) for line in make_notes(seed)] + pseudo_words(60_000, 0)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=V, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    if tok.get_vocab_size() != V:
        raise SystemExit(f"the tokenizer has {tok.get_vocab_size()} tokens, not {V}: give it more text")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                                eos_token="<|endoftext|>", unk_token="<|endoftext|>",
                                                padding_side="right")
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    eos = int(fast.eos_token_id)
    config = transformers.GPT2Config(n_layer=layers, n_embd=D, n_head=12, vocab_size=V, n_positions=1024,
                                     bos_token_id=eos, eos_token_id=eos, tie_word_embeddings=True)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)


def gleak(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "gleak"), *args]


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(peak RSS in MB, wall seconds, stdout) of ``cmd`` under /usr/bin/time -v."""
    out = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env, check=True)
    found_rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr)
    found_wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", out.stderr)
    if found_rss is None or found_wall is None:
        raise SystemExit(f"/usr/bin/time -v gave no RSS or wall time:\n{out.stderr[-2000:]}")
    rss = int(found_rss.group(1))
    wall = found_wall.group(1)
    seconds = 0.0
    for part in wall.split(":"):
        seconds = seconds * 60 + float(part)
    return rss / 1024, seconds, out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/gleak-bench"))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tokens_cli.md")
    args = parser.parse_args()
    folder = args.cache / f"gpt2-{V}-{args.layers}l"
    if not (folder / "model.safetensors").exists():
        start = time.perf_counter()
        build_folder(folder, args.layers)
        print(f"built {folder} in {time.perf_counter() - start:.0f} s", flush=True)
    data = args.cache / "notes-heldout.txt"
    data.write_text("\n".join(notes_module().make_notes(2001)) + "\n")
    capture = args.cache / f"capture-{args.layers}l.safetensors"
    env = dict(os.environ)
    subprocess.run(gleak("simulate", "--model", str(folder), "--data", str(data), "--batch-size", "8",
                         "--max-length", "32", "--output", str(capture), "--force", "--quiet"), check=True, env=env)
    runs: list[dict[str, Any]] = []
    for _ in range(args.runs):
        rss, wall, stdout = timed(gleak("labels", str(capture), "--model", str(folder), "--format", "json"), env)
        report = json.loads(stdout)
        bag = next(r for r in report["results"] if r["attack"] == "token-bag")
        runs.append({"rss_mb": rss, "seconds": wall, "threads": report.get("threads"),
                     "attacks": {r["attack"]: r["seconds"] for r in report["results"]},
                     "method": bag.get("method"), "scores": bag.get("scores")})
        print(json.dumps(runs[-1]), flush=True)
    write(args.out, runs, args)


def write(path: Path, runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    rss = [float(r["rss_mb"]) for r in runs]
    wall = [float(r["seconds"]) for r in runs]
    load = os.getloadavg()
    last = runs[-1]
    scores = last["scores"] or {}
    assert isinstance(scores, dict)
    lines = ["# gleak labels on a language model's capture at V = 50,257 (bench/tokens_cli.py)", "",
             f"GPT-2-style random weights, d = {D}, {args.layers} blocks, tied, V = {V:,} (byte-level BPE of "
             f"exactly {V:,} tokens); capture: `gleak simulate --batch-size 8 --max-length 32` (FedSGD) on "
             "held-out synthetic notes. Command: `gleak labels CAPTURE --model DIR --format json` under "
             f"`/usr/bin/time -v`, {len(runs)} runs, {last['threads']} torch threads, {os.cpu_count()} CPU cores, "
             f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min) when written.", "",
             "| | min | median | max |", "|---|---|---|---|",
             f"| peak RSS (MB) | {min(rss):.0f} | {statistics.median(rss):.0f} | {max(rss):.0f} |",
             f"| wall time (s) | {min(wall):.1f} | {statistics.median(wall):.1f} | {max(wall):.1f} |", "",
             "Per attack (last run, s): " + ", ".join(f"{k} {float(v):.1f}" for k, v in last["attacks"].items()
                                                     if k != "union") + " (lora-tokens: not applicable).",
             f"token-bag: method {last['method']}, recall {scores.get('recall', float('nan')):.3f}, precision "
             f"{scores.get('precision', float('nan')):.3f} against the input tokens; precision "
             f"{scores.get('precision_all', float('nan')):.3f} against every token of the batch.", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
