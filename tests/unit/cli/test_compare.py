"""``lit-entropy-compare`` (lit_entropy.cli.compare) in-process: one named figure of a run and its table. The
figure's pieces: tests/unit/analysis/test_compare.py."""

from __future__ import annotations


def test_compare_writes_one_named_figure_of_a_run(tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    from lit_entropy.cli.compare import main as compare_main

    run = tmp_path / "runs" / "r"
    writer = SummaryWriter(log_dir=str(run / "tensorboard"))
    for it in range(4):
        writer.add_scalar("epoch", it, it)
        for tag, value in (("rollout/entropy", 0.5 - 0.02 * it), ("rollout/accuracy", 0.2 + 0.05 * it),
                           ("control/band_low", 0.45 - 0.01 * it), ("control/band_high", 0.55 - 0.01 * it)):
            writer.add_scalar(tag, value, it)
    writer.close()
    out = tmp_path / "img"
    assert compare_main([str(run), "--metrics", "rollout/entropy,rollout/accuracy", "--out", str(out),
                         "--name", "default_run", "--title", "The default run"]) == 0
    assert (out / "default_run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| r |" in (out / "default_run.md").read_text()
    assert "wrote" in capsys.readouterr().out
