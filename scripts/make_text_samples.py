"""Build the synthetic text sample deterministically from a seed (no downloads, no real person's data).

Writes ``samples/text/notes.txt`` (clinical-style notes about invented patients: fake names, dates of birth,
visit dates and record numbers, all drawn from small built-in lists with ``random.Random(seed)``), a word-level
tokenizer trained on them with ``tokenizers``, and a tiny random-weight LLaMA-style causal LM (2 layers,
hidden 64, untied head) saved with ``save_pretrained`` in ``samples/text/notes-llama/`` (config.json,
model.safetensors, tokenizer files). Then records them in ``samples/manifest.json`` (the ``text`` entry).

Needs the ``text`` extra (transformers, tokenizers). Run: ``python scripts/make_text_samples.py [--seed 0]``
(``make samples`` runs it after ``scripts/build_samples.py``). Rebuilds are byte-identical for the same seed
and the same transformers/tokenizers/torch versions: config.json records ``transformers_version``, and a
different torch or transformers may draw the random initial weights in another order.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "samples"
NOTES = "text/notes.txt"
MODEL = "text/notes-llama"
LINES = 300
PATIENTS = 60

FIRST = ["Alice", "Amara", "Bruno", "Carmen", "Chen", "Dmitri", "Elena", "Esther", "Farid", "Fatima", "Grace",
         "Hiro", "Ingrid", "Jamal", "Karin", "Luca", "Maya", "Nadia", "Omar", "Priya", "Rafael", "Sofia", "Tomas",
         "Yusuf"]
LAST = ["Abara", "Berg", "Costa", "Dahl", "Eklund", "Ferreira", "Gruber", "Haddad", "Ivanova", "Jensen", "Kowalski",
        "Lindqvist", "Moreau", "Novak", "Okafor", "Petrova", "Quinn", "Rossi", "Sato", "Tanaka", "Varga", "Weber"]
DOCTORS = ["Dr. Holm", "Dr. Mensah", "Dr. Ortega", "Dr. Keller", "Dr. Ansari"]
COMPLAINTS = ["chest pain", "shortness of breath", "persistent cough", "lower back pain", "headache", "dizziness",
              "abdominal pain", "fatigue", "joint pain", "skin rash", "fever", "sore throat", "palpitations",
              "nausea", "insomnia"]
DURATIONS = ["since yesterday", "for 2 days", "for 3 days", "for a week", "for 2 weeks", "for a month"]
FINDINGS = ["lungs clear", "mild wheeze on the left", "abdomen soft and non tender", "no focal deficit",
            "throat red without exudate", "heart sounds normal", "tender lumbar muscles", "rash on both forearms"]
PLANS = ["rest and fluids", "ibuprofen 400 mg as needed", "amoxicillin 500 mg three times daily for 7 days",
         "ECG and blood tests", "chest X-ray", "referral to cardiology", "referral to physiotherapy",
         "salbutamol inhaler as needed", "sleep hygiene advice", "no medication"]
FOLLOW = ["follow up in 1 week", "follow up in 2 weeks", "return if symptoms worsen", "review results by phone",
          "follow up in 1 month"]
KINDS = ["Clinic visit", "Phone consult", "Follow up", "Emergency visit", "Home visit"]


def make_notes(seed: int) -> list[str]:
    """``LINES`` one-line notes about ``PATIENTS`` invented patients (each with a fixed record number and date
    of birth, seen several times), every value drawn from the lists above."""
    rng = random.Random(seed)
    patients = []
    for mrn in rng.sample(range(100000, 999999), PATIENTS):
        born = f"{rng.randint(1940, 2005)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        patients.append((rng.choice(FIRST), rng.choice(LAST), mrn, born))
    lines = []
    for _ in range(LINES):
        first, last, mrn, born = rng.choice(patients)
        day = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        note = (f"{day} {rng.choice(KINDS)}. {first} {last}, MRN {mrn}, DOB {born}, reports "
                f"{rng.choice(COMPLAINTS)} {rng.choice(DURATIONS)}. BP {rng.randint(100, 165)}/{rng.randint(60, 100)}, "
                f"HR {rng.randint(55, 110)}, {rng.choice(FINDINGS)}. Plan: {rng.choice(PLANS)}, "
                f"{rng.choice(FOLLOW)}. {rng.choice(DOCTORS)}")
        lines.append(note)
    return lines


def build(root: Path, seed: int) -> dict[str, object]:
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    transformers.utils.logging.disable_progress_bar()
    lines = make_notes(seed)
    notes = root / NOTES
    notes.parent.mkdir(parents=True, exist_ok=True)
    notes.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(lines, trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]", "[BOS]", "[EOS]"],
                                                             show_progress=False))
    model_dir = root / MODEL
    shutil.rmtree(model_dir, ignore_errors=True)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]",
                                                eos_token="[EOS]", pad_token="[PAD]", padding_side="right",
                                                model_max_length=128)
    fast.save_pretrained(model_dir)
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=len(fast),
                                      max_position_embeddings=128, pad_token_id=fast.pad_token_id,
                                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                                      tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(model_dir)
    params = sum(p.numel() for p in model.parameters())
    files = sorted(p for p in [notes, *model_dir.iterdir()] if p.is_file())
    size = sum(p.stat().st_size for p in files)
    for p in files:
        print(f"{p.relative_to(root)}: {p.stat().st_size:,} bytes  sha256 {hashlib.sha256(p.read_bytes()).hexdigest()}")
    print(f"text sample: {len(lines)} notes, vocabulary {len(fast)}, {params:,} parameters, {size / 1e6:.2f} MB")
    return {"notes": f"samples/{NOTES}", "notes_lines": len(lines), "seed": seed, "model": f"samples/{MODEL}",
            "architecture": "LlamaForCausalLM", "layers": 2, "hidden": 64, "tied_embeddings": False,
            "vocab_size": len(fast), "parameters": params}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="the notes' and the initial weights' seed (default 0)")
    parser.add_argument("--out", type=Path, default=ROOT,
                        help="the samples folder (default samples/; its manifest.json gets the text entry)")
    args = parser.parse_args()
    entry = build(args.out, args.seed)
    manifest = args.out / "manifest.json"
    data = json.loads(manifest.read_text()) if manifest.exists() else {}
    data["text"] = entry
    manifest.write_text(json.dumps(data, indent=2) + "\n")
