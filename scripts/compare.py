"""Overlay chosen metrics across runs: one panel per metric, one line per run, plus a Markdown table.

    python scripts/compare.py logs/sweep/multiruns/<time>            # every job of a multirun
    python scripts/compare.py logs/a/runs/<time> logs/b/runs/<time> \\
        [--metrics rollout/entropy,rollout/accuracy,...] [--smooth N] [--out DIR] [--name NAME] [--title T]

The same program as the installed ``lit-entropy-compare``; see :mod:`lit_entropy.cli.compare`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout this script sits in, before any installed copy
    sys.path.insert(0, str(ROOT))

from lit_entropy.cli.compare import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
