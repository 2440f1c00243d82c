"""Train a policy with RL: `python scripts/train.py [group=option ...] [key=value ...]`.

Examples:
    python scripts/train.py                                   # the Countdown lab with Entrocraft
    python scripts/train.py callbacks/entropy=none            # same run, no entropy controller
    python scripts/train.py debug=smoke                       # a one-minute check
    python scripts/train.py -m callbacks/entropy=none,entrocraft

The same program as the installed ``lit-entropy-train``; see :mod:`lit_entropy.cli.train`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout this script sits in, before any installed copy
    sys.path.insert(0, str(ROOT))

from lit_entropy.cli.train import main  # noqa: E402

if __name__ == "__main__":
    main()
