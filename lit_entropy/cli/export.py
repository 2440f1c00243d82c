"""``lit-entropy-export`` / ``scripts/export.py``: a training checkpoint as a plain Hugging Face model folder.

    lit-entropy-export logs/<task>/runs/<time>/checkpoints/last.ckpt exported/            # fp32
    lit-entropy-export <run>/checkpoints/last.ckpt exported/ --dtype bf16 --force
    lit-entropy-export <somewhere>/last.ckpt exported/ --model-dir <base model folder>   # no .hydra/ beside it

The base model comes from the run's ``.hydra/config.yaml`` beside ``checkpoints/`` (or ``--model-dir``);
LoRA adapters are merged into the weights. transformers' ``from_pretrained`` and vLLM load the folder
without this package. See :mod:`lit_entropy.export`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lit-entropy-export", description=__doc__.split("\n\n", 1)[0],
                                 epilog="The same program as scripts/export.py.")
    ap.add_argument("checkpoint", type=Path, help="a training checkpoint, e.g. <run>/checkpoints/last.ckpt")
    ap.add_argument("out_dir", type=Path, help="the folder to write (must be empty or absent, unless --force)")
    ap.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                    help="dtype of the saved weights (default fp32)")
    ap.add_argument("--force", action="store_true", help="replace a non-empty out_dir (its content is deleted)")
    ap.add_argument("--trust-checkpoint", action="store_true",
                    help="load a checkpoint that the weights-only load refuses with full unpickling, which runs any "
                         "code the file holds: only for a file you trust (lit-entropy's own never need it)")
    ap.add_argument("--model-dir", default=None,
                    help="the base model's Hugging Face folder (or hub id): for a checkpoint without its run's "
                         ".hydra/config.yaml, or a run whose base folder moved")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Export the checkpoint named in ``argv`` (default ``sys.argv[1:]``); 0 on success, 1 on a refusal (the
    reason on stderr)."""
    args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from lit_entropy.utils.terminal import quiet_third_party

    quiet_third_party(verbose=False)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    from lit_entropy.export import ExportError, export_checkpoint

    try:
        out = export_checkpoint(args.checkpoint, args.out_dir, dtype=args.dtype, force=args.force,
                                model_dir=args.model_dir, trust=args.trust_checkpoint)
    except ExportError as err:
        print(f"lit-entropy-export: error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({', '.join(sorted(p.name for p in out.iterdir()))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
