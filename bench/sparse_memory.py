"""Peak memory of ``sparse-tokens`` at a large vocabulary (issue 45: "streamed over V, memory bounded at V = 128k").

    python bench/sparse_memory.py --vocab 128000 --width 768      # about 1 min on 2 cores
    python bench/sparse_memory.py --vocab 128000 --width 4096 --layers 1 --stream

A LLaMA-style model of ``--layers`` blocks (random weights) at ``--vocab`` and ``--width``, LoRA r = 16 on q and v
(trained adapter), B = 8 notes of 40 tokens; the process's peak RSS after building the model and the capture, and
after the attack (``--stream`` forces the streamed dictionary). Prints one line per stage and writes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from sparse_tokens import lora_capture  # noqa: E402

from gleak.attacks.tokens import atoms  # noqa: E402
from gleak.metrics.tokens import bag_scores, truth_bags  # noqa: E402
from tests.notes_lm import bpe_tokenizer, encode, make_notes  # noqa: E402
from tests.token_models import adapt, run_token_attack, spec_of, text_context  # noqa: E402


def peak_mb() -> float:
    """The process's peak RSS (VmHWM) since the last :func:`reset_peak`, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def now_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak() -> None:
    """Reset the peak RSS to the current RSS (Linux: 5 to /proc/self/clear_refs)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=128000)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--stream", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(2)
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=args.vocab, hidden_size=args.width,
                                        intermediate_size=2 * args.width, num_hidden_layers=args.layers,
                                        num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                                        bos_token_id=1, eos_token_id=2, pad_token_id=0)).eval()
    lines = [n for s in range(1, 21) for n in make_notes(s)]
    tok = bpe_tokenizer(lines, 8000)
    notes = [n for s in range(2001, 2003) for n in make_notes(s)][:8]
    ids, mask = encode(tok, notes, 40)
    tensors = lora_capture(adapt(base, 16, trained=True, seed=1, targets=["q_proj", "v_proj"]), [(ids, mask)])
    import gc

    gc.collect()
    reset_peak()
    before = now_mb()
    print(f"model V = {args.vocab}, d = {args.width} and capture held: RSS {before:.0f} MB", flush=True)
    if args.stream:
        atoms.CACHE_BYTES = 0
    ctx = text_context(tensors, spec_of(base, "gradient", 1, None, batch_size=8, max_length=int(ids.shape[1])))
    ctx.model = base
    start = time.perf_counter()
    result = run_token_attack("sparse-tokens", ctx)
    seconds = time.perf_counter() - start
    assert result.output is not None and hasattr(result.output, "bag"), result.reason
    s = bag_scores(result.output.bag(), truth_bags(ids, mask)["inputs"], args.vocab)
    print(f"sparse-tokens ({'streamed' if args.stream else 'held where it fits'}): recall {s['recall']:.3f}, "
          f"precision {s['precision']:.3f}, {seconds:.1f} s; peak RSS {peak_mb():.0f} MB "
          f"(+{peak_mb() - before:.0f} MB over the model and capture)")


if __name__ == "__main__":
    main()
