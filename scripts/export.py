"""Export a training checkpoint as a plain Hugging Face model folder (transformers and vLLM load it).

    python scripts/export.py logs/<task>/runs/<time>/checkpoints/last.ckpt exported/
    python scripts/export.py <run>/checkpoints/last.ckpt exported/ --dtype bf16 --force
    python scripts/export.py <somewhere>/last.ckpt exported/ --model-dir <base model folder>

LoRA adapters are merged into the weights. The same program as the installed ``lit-entropy-export``; see
:mod:`lit_entropy.cli.export`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout this script sits in, before any installed copy
    sys.path.insert(0, str(ROOT))

from lit_entropy.cli.export import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
