"""Rebuild the lab policy's shipped warm start, `lit_entropy/policy/lab_start/`: `python scripts/build_lab_start.py`.

Warm-starts the default `TinyLabPolicy` on this machine (one thread, a minute or two) and writes its folder, with
its cache key and checksums, where the package ships it. Needed only when a default of the lab's architecture, warm
start or task changes; `tests/unit/policy/test_models.py` names this script when the shipped copy no longer matches.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout this script sits in, before any installed copy
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lit_entropy.policy.models import LAB_START, TinyLabPolicy  # noqa: E402


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    torch.set_num_threads(1)  # the thread count can change the float sums; the shipped copy is made on one
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(TinyLabPolicy(cache_dir=tmp, shipped=False).build().path)
        shutil.rmtree(LAB_START, ignore_errors=True)
        shutil.copytree(built, LAB_START)
    for file in LAB_START.iterdir():
        file.chmod(0o644)
    print(f"wrote {LAB_START} ({sum(f.stat().st_size for f in LAB_START.iterdir()) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
