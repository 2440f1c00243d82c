"""Evaluate a policy with sampling: accuracy, mean@k and unbiased pass@k.

Hydra overrides of ``conf/evaluate.yaml`` (the training groups model, rollout, reward, data, plus
``ckpt_path=`` and ``eval.*``)::

    python scripts/evaluate.py                                          # the warm-started lab policy
    python scripts/evaluate.py ckpt_path=logs/<task>/runs/<time>/checkpoints/last.ckpt eval.n=16 'eval.k=[1,4,16]'
    python scripts/evaluate.py data=jsonl data.prompts.path=my.jsonl eval.limit=50 eval.out=res.json
    python scripts/evaluate.py model=hf model.name_or_path=<dir> data=math500 rollout=vllm eval.limit=100

``--help`` prints the usage, ``--cfg job`` the composed config. The same program as the installed
``lit-entropy-eval``; see :mod:`lit_entropy.evaluation_run`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lit_entropy.cli.evaluate import main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[1:])
