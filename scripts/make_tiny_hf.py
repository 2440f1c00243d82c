"""Build the tiny Hugging Face-format policy (trained BPE tokenizer + chat template + random tiny Qwen2).

    python scripts/make_tiny_hf.py --out .cache/tiny_hf_gsm8k              # tokenizer trained on GSM8K train
    python scripts/train.py model=hf model.name_or_path=.cache/tiny_hf_gsm8k data=gsm8k data.chat_template=true
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lit_entropy.policy.hf_tiny import build_tiny_hf_policy  # noqa: E402
from lit_entropy.tasks.math_sources import MathDataset  # noqa: E402


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--data", default="gsm8k_train", help="math set whose questions and answers train the tokenizer")
    p.add_argument("--data-dir", default=None,
                   help="folder of the math JSONL files (default: $LIT_ENTROPY_DATA, else ./data)")
    p.add_argument("--vocab-size", type=int, default=512)
    args = p.parse_args(argv)
    source = MathDataset(args.data, data_dir=args.data_dir, template="{question}", shuffle=False)
    texts = [f"{q.text}\n{q.reference}" for q in source.all_prompts()]
    out = build_tiny_hf_policy(args.out, texts, vocab_size=args.vocab_size)
    print(f"wrote {out} ({len(texts)} texts)")
    return out


if __name__ == "__main__":
    main()
