"""``lit-entropy-eval`` (lit_entropy.cli.evaluate): Hydra overrides only, a flag answered with a hint. The
evaluation it runs: tests/integration/test_evaluation_run.py."""

from __future__ import annotations

import pytest


def test_eval_rejects_flags_with_a_hint():
    from lit_entropy.cli.evaluate import main as eval_main

    with pytest.raises(SystemExit, match="Hydra overrides"):
        eval_main(["--n", "16"])
