"""What TensorBoard shows to compare runs: each run's row in the HParams table, and a custom-scalars layout for
the entropy story.

**HParams.** At the start of training each TensorBoard logger gets the run's hyperparameters: its choice in
every config group (``algo``, ``callbacks/entropy``, ``model``, ``data``, ``precision``, …), the keys one sweeps
(:data:`SWEPT_KEYS`: seed, learning rate, clip range, temperature, batch shape, …), the controller's own settings,
and every scalar key given on the command line (so the axis of a Hydra multirun or a study is always there) — not
the whole resolved tree, which is in ``.hydra/config.yaml``; the keys a multirun sweeps (or, outside one, the
command line's) are marked as differing, so TensorBoard shows them first (:func:`varied_keys`). Its metrics are the headline tags
(:func:`headline_tags`): ``rollout/accuracy`` and ``rollout/entropy`` (their last values), ``summary/accuracy_best``
and ``summary/entropy_min`` (logged by this callback every iteration from its running best and lowest, which live
in its ``state_dict`` so a resumed run carries them on), and each evaluation split's greedy and sampled pass@k
where ``callbacks.eval`` runs. The HParams table shows each metric's latest value, so it is current while a run
goes and final at its end. The summaries are written directly (not through Lightning's ``log_hyperparams``, which
would write a value for every metric at step 0 and so a fake first point on the evaluation curves). One run folder
is one row: a run resumed into its own folder writes the summary again and stays one row.

**The layout.** :data:`LAYOUT` groups the tags the entropy story needs into charts of TensorBoard's *Custom
Scalars* tab, each chart overlaying the runs: the entropy with its controller's band or target, the controller's
knob, accuracy and reward, held-out pass@k, the clip fractions and the sampler/trainer mismatch. Per-iteration tags
stay on the iteration axis and ``train/*`` on the optimizer step (lit_entropy/utils/log_steps.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
from omegaconf import DictConfig, OmegaConf

Scalar = bool | int | float | str

SWEPT_KEYS: tuple[str, ...] = (
    "seed", "optim.lr", "optim.weight_decay", "algo.name", "algo.loss", "algo.advantage", "algo.eps_low",
    "algo.eps_high", "algo.entropy_coef", "algo.kl_coef", "algo.loss_agg", "rollout.temperature", "rollout.top_p",
    "rollout.max_new_tokens", "rollout.max_staleness", "batch.prompts_per_iter", "batch.group_size",
    "batch.num_minibatches", "batch.ppo_epochs", "batch.dynamic_sampling", "trainer.precision",
    "trainer.max_epochs",
)
"""The keys a user sweeps, logged as hyperparameters of every run (where the config has them)."""

GROUPS_LEFT_OUT = ("hydra", "paths", "logger", "callbacks", "module")
"""Config groups whose choice says nothing about the result (``callbacks``' own choice is the list of the
callback groups, each of which is logged: ``callbacks/entropy``, ``callbacks/eval``, …)."""

KNOB_TAGS: tuple[str, ...] = (
    "direction", "entrocraft_kept_frac", "eps_high", "entropy_coef", "pic_alpha", "repo_lambda", "repo_beta",
    "stare_gate", "stare_w", "stare_m", "stare_reweighted_frac", "aepo_rows_frac", "aepo_temperature",
    "gppo_beta_low", "gppo_beta_high",
)
"""The ``control/*`` tags that show what each entropy controller turns (one or more per controller)."""

LAYOUT: dict[str, dict[str, list[Any]]] = {
    "entropy": {
        "entropy and its band or target": ["Multiline", [r"^rollout/entropy$",
                                                         r"^control/(band_low|band_high|target_entropy)$"]],
        "the controller's knob": ["Multiline", [rf"^control/({'|'.join(KNOB_TAGS)})$"]],
        "accuracy and reward": ["Multiline", [r"^rollout/(accuracy|reward_mean)$"]],
        "evaluation pass@k": ["Multiline", [r"^eval/.*pass@\d+$"]],
    },
    "update": {
        "clip fractions (optimizer step)": ["Multiline", [r"^train/clipfrac_(low|high)$"]],
        "sampler/trainer mismatch": ["Multiline", [r"^rollout_corr/(kl|k3_kl)$"]],
    },
}
"""The custom-scalars layout: category → chart title → ``["Multiline", [tag regexes]]``. TensorBoard keeps the tags
that ``re.match`` a chart's regexes (anchored at the start only), so each regex ends in ``$`` where a longer tag
must not join it."""

BEST = {"summary/accuracy_best": ("rollout/accuracy", max), "summary/entropy_min": ("rollout/entropy", min)}
"""The running summaries this callback logs: tag → (the tag it follows, how it combines)."""


def _scalar(value: Any) -> Scalar | None:
    if isinstance(value, bool | int | float | str):
        return value
    if value is None:
        return "null"
    if OmegaConf.is_config(value):
        return None  # a sub-tree: its keys are listed on their own where they matter
    return str(value)


def run_hparams(cfg: DictConfig, choices: Mapping[str, Any] | None = None,
                overrides: Sequence[str] = ()) -> dict[str, Scalar]:
    """The hyperparameters of a run as the HParams table shows them.

    ``choices``: Hydra's group choices (``hydra.runtime.choices``); without them (a config composed in code) the
    ``algo`` and the controller are read from the config. ``overrides``: the command line's (``hydra.overrides.task``);
    each scalar key among them is logged (a group choice is a choice already). The controller's own settings
    come as ``controller.<key>``.
    """
    out: dict[str, Scalar] = {}
    for group, option in sorted((choices or {}).items()):
        if option is not None and group not in GROUPS_LEFT_OUT and not group.startswith("hydra/"):
            out[group] = str(option)
    entropy = OmegaConf.select(cfg, "callbacks.entropy")
    target = str(entropy.get("_target_", "")) if isinstance(entropy, DictConfig) else ""
    out.setdefault("algo", str(OmegaConf.select(cfg, "algo.name", default="?")))
    out.setdefault("callbacks/entropy", target.rsplit(".", 1)[-1] or "none")
    keys = list(SWEPT_KEYS)
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        if "=" in item and key not in (choices or {}) and not key.startswith("hydra"):
            keys.append(key)
    for key in keys:
        value = _scalar(OmegaConf.select(cfg, key, default=None, throw_on_missing=False))
        if value is not None and (value != "null" or key not in SWEPT_KEYS):
            out[key] = value
    if isinstance(entropy, DictConfig):
        for key, value in entropy.items():
            v = _scalar(value)
            if key != "_target_" and v is not None:
                out[f"controller.{key}"] = v
    return out


def varied_keys(overrides: Sequence[str], sweep: Sequence[str] = ()) -> list[str]:
    """The hyperparameters that tell this run from its neighbours, shown first in the HParams table: in a Hydra
    multirun the keys the sweep varies (``sweep``: its overrides, e.g. ``callbacks/entropy=none,adapo``), otherwise
    every key given on the command line (a study's runs differ in theirs)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    if sweep:
        return [o.key_or_group.lstrip("+~") for o in parser.parse_overrides(list(sweep)) if o.is_sweep_override()]
    return [item.split("=", 1)[0].lstrip("+~") for item in overrides
            if "=" in item and not item.lstrip("+~").startswith("hydra")]


def headline_tags(eval_tags: Sequence[str] = ()) -> list[str]:
    """The HParams metrics: the last and best accuracy, the last and lowest entropy, and ``eval_tags``."""
    return ["rollout/accuracy", "summary/accuracy_best", "rollout/entropy", "summary/entropy_min", *eval_tags]


def write_hparams(writer: Any, hparams: Mapping[str, Scalar], metrics: Sequence[str],
                  varied: Sequence[str] = ()) -> None:
    """The HParams plugin's three summaries (experiment, session start, session end) into ``writer`` (a
    ``SummaryWriter``), declaring ``metrics`` without writing a value for them.

    The ``varied`` hyperparameters are marked as differing between runs: TensorBoard lists those first (then the
    rest by name) and shows the first five as columns, so a sweep's axis is in view without ticking boxes.
    """
    from tensorboard.plugins.hparams import plugin_data_pb2
    from torch.utils.tensorboard.summary import hparams as hparams_summaries

    experiment, *session = hparams_summaries(dict(hparams), dict.fromkeys(metrics, 0.0))
    value = experiment.value[0]
    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
    for info in data.experiment.hparam_infos:
        info.differs = info.name in varied
    value.metadata.plugin_data.content = data.SerializeToString()
    file_writer = writer._get_file_writer()
    for summary in (experiment, *session):
        file_writer.add_summary(summary)
    writer.flush()


class RunDashboard(pl.Callback):
    """Writes each TensorBoard logger's HParams summaries and custom-scalars layout at the start of training, and
    logs ``summary/accuracy_best`` and ``summary/entropy_min`` every iteration (see the module's docstring).

    ``build`` (lit_entropy/train.py) appends it after every other callback, so an iteration's evaluation is logged
    before it reads the iteration's values.
    """

    knobs: tuple[str, ...] = ()

    def __init__(self, hparams: Mapping[str, Scalar], varied: Sequence[str] = ()) -> None:
        self.hparams = dict(hparams)
        self.varied = list(varied)
        self.best: dict[str, float] = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        writers = [lg.experiment for lg in trainer.loggers if type(lg).__name__ == "TensorBoardLogger"]
        if not writers or trainer.global_rank != 0:
            return
        metrics = headline_tags(self.eval_tags(trainer))
        for writer in writers:
            write_hparams(writer, self.hparams, metrics, self.varied)
            writer.add_custom_scalars(LAYOUT)
            writer.flush()

    @staticmethod
    def eval_tags(trainer: pl.Trainer) -> list[str]:
        """The pass@k tags the run's evaluation callback will log (none without one)."""
        tags: list[str] = []
        for cb in trainer.callbacks:
            metric_tags = getattr(cb, "headline_tags", None)
            if callable(metric_tags):
                tags += metric_tags()
        return tags

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        logged = trainer.callback_metrics
        for tag, (source, combine) in BEST.items():
            value = logged.get(source)
            if value is None or value.numel() != 1 or not math.isfinite(float(value)):
                continue
            self.best[tag] = combine(self.best.get(tag, float(value)), float(value))
        if self.best:
            pl_module.log_dict(dict(self.best), on_step=False, on_epoch=True, batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        return {"best": dict(self.best)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = {str(k): float(v) for k, v in state_dict.get("best", {}).items()}
