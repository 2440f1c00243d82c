"""Shared test helpers: compose the real config, read TensorBoard event files."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def compose_train(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in every TensorBoard event file under ``run_dir``: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    files = sorted(Path(run_dir).rglob("events.out.tfevents.*"))
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


def read_text_tags(run_dir: Path) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: list[str] = []
    for f in sorted(Path(run_dir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f), size_guidance={"tensors": 0})
        acc.Reload()
        tags.extend(acc.Tags().get("tensors", []))
    return tags
