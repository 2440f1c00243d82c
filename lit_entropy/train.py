"""Build a run from a composed Hydra config and fit it. ``scripts/train.py`` is the command-line face."""

from __future__ import annotations

import logging
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from hydra.utils import instantiate
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from lit_entropy.algo import unread_clip_advice
from lit_entropy.callbacks.dashboard import RunDashboard, run_hparams, varied_keys
from lit_entropy.callbacks.interrupt import InterruptLatch
from lit_entropy.iteration import draw_refusals
from lit_entropy.objectives import advantages as adv
from lit_entropy.objectives.rollout_correction import check_with_algo, staleness_advice
from lit_entropy.policy.precision import cpu_half_support, slow_half_precision_note
from lit_entropy.rollout.base import SamplingConfig
from lit_entropy.rollout.batch import BatchConfig
from lit_entropy.rollout.sampler import Sampler
from lit_entropy.utils.checkpointing import check_resumable
from lit_entropy.utils.dist import rank
from lit_entropy.utils.log_steps import tensorboard_resume, write_again
from lit_entropy.utils.terminal import quiet_third_party, startup_block

log = logging.getLogger(__name__)


def instantiate_callbacks(cfg: DictConfig | None) -> list[pl.Callback]:
    """Every node under ``callbacks`` with a ``_target_`` (one level of nesting, e.g. ``entropy``)."""
    found: list[pl.Callback] = []

    def visit(node: Any, path: str) -> None:
        if not isinstance(node, DictConfig):
            return
        if "_target_" in node:
            cb = instantiate(node)
            if not isinstance(cb, pl.Callback):
                raise TypeError(f"callbacks.{path}: {node._target_} is not a lightning Callback")
            found.append(cb)
            return
        for key, child in node.items():
            visit(child, f"{path}.{key}" if path else str(key))

    visit(cfg, "")
    return found


def instantiate_loggers(cfg: DictConfig | None, resume_step: int | None = None,
                       resume_iteration: int | None = None) -> list[Any]:
    """The ``logger`` nodes. ``resume_step``, ``resume_iteration``: a resumed run's first optimizer step and the
    iterations its checkpoint finished. TensorBoard writers get a ``purge_step`` from them, so in the same log
    folder TensorBoard hides what the interrupted run logged after its checkpoint (the resumed run logs those
    steps again, identically), on both axes (:func:`lit_entropy.utils.log_steps.tensorboard_resume`)."""
    if not cfg:
        return []
    out = []
    for node in cfg.values():
        if isinstance(node, DictConfig) and "_target_" in node:
            extra, again = {}, []
            if resume_step is not None and "TensorBoardLogger" in node._target_:  # 0 too: the boundary-0 checkpoint
                purge = resume_step
                if resume_iteration is not None:
                    purge, again = tensorboard_resume(instantiate(node).log_dir, resume_step, resume_iteration)
                extra = {"purge_step": purge}
            if "MLFlowLogger" in node._target_ and str(node.get("tracking_uri", "")).startswith("file:"):
                # MLflow 3 asks for an opt-in to its (maintained, not developed) local file store.
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            logger = instantiate(node, **extra)
            if again and rank_zero_only.rank == 0:  # the process that writes the logs (rank 0's experiment)
                write_again(logger.experiment, again)
            out.append(logger)
    return out


def check_knob_owners(callbacks: list[pl.Callback], algo: Any = None) -> None:
    """Two controllers driving one knob fight each other: refuse at start-up, naming both.

    A fixed value set by the ``algo`` preset counts as an owner too (e.g. ``algo=entropy_bonus`` and an
    adaptive entropy bonus both setting ``entropy_coef``).
    """
    owners: dict[str, str] = {}
    if algo is not None and getattr(algo, "entropy_coef", 0) > 0:
        owners["entropy_coef"] = f"algo={algo.name} (entropy_coef={algo.entropy_coef})"
    for cb in callbacks:
        for knob in getattr(cb, "knobs", ()):
            if knob in owners:
                raise ValueError(f"knob {knob!r} is driven by both {owners[knob]} and {type(cb).__name__}")
            owners[knob] = type(cb).__name__


def check_controllers_and_algo(callbacks: list[pl.Callback], algo: Any) -> None:
    """A controller that cannot act under the objective's loss (its class's ``refused_losses``, e.g. one that drives
    the clip range under a loss that replaces the clip): refuse at start-up, naming both."""
    loss = getattr(algo, "loss", "ppo")
    for cb in callbacks:
        if loss in getattr(cb, "refused_losses", ()):
            raise ValueError(f"{type(cb).__name__} " + cb.refusal.format(loss=loss, algo=getattr(algo, "name", "?")))


def build_sampler(cfg: DictConfig, engine: Any = None) -> Sampler:
    """The ``rollout`` group (engine and sampling) and the ``reward`` group as one :class:`Sampler`.

    ``engine``: a started engine or a factory replacing ``rollout.engine``. The engine's own values are
    checked here (``validate``), before anything is started.
    """
    rollout = OmegaConf.to_container(cfg.rollout, resolve=True)
    if engine is None:
        engine = instantiate(cfg.rollout.engine)
        validate = getattr(getattr(engine, "func", None), "validate", None)
        if callable(validate):
            validate(**engine.keywords)
    sampling = SamplingConfig(**{k: v for k, v in rollout.items() if k != "engine"})
    return Sampler(engine, sampling, instantiate(cfg.reward))


def check_batch_and_algo(batch: BatchConfig, algo: Any) -> None:
    """Combinations of the ``batch`` and ``algo`` groups that cannot work, named at start-up."""
    advantage = getattr(algo, "advantage", None)
    if batch.dynamic_sampling and advantage in adv.NO_BASELINE:
        raise ValueError(f"batch.dynamic_sampling drops all-equal groups, but algo.advantage={advantage} has no "
                         "baseline and learns from them: pick one")


def explain_target_error(err: Exception) -> Exception:
    """Hydra's "Error locating target 'pkg.Name'" (a ``_target_`` whose module does not import), with what the
    import said and how to make a module of one's own importable; any other error unchanged."""
    import re

    found = re.search(r"Error locating target '([^']+)'", str(err))
    if not found:
        return err
    target = found.group(1)
    key = re.search(r"full_key: (\S+)", str(err))
    cause = err.__cause__
    while cause is not None and (cause.__cause__ or cause.__context__) is not None:  # the root of the chain
        cause = cause.__cause__ or cause.__context__
    why = f"{type(cause).__name__}: {str(cause).splitlines()[0]}" if cause is not None else "it does not import"
    module = target.rsplit(".", 1)[0]
    return ImportError(
        f"{key.group(1) + '._target_' if key else '_target_'}={target}: cannot import it ({why}). A module of your "
        f"own must be importable from where the run starts: put the folder that holds {module.split('.')[0]}.py (or "
        f"its package folder) on the path, e.g. PYTHONPATH=/path/to/that/folder lit-entropy-train ..., or install it "
        f"(pip install -e); the reward workers import it the same way (docs/custom_task.md)")


def hydra_context() -> tuple[dict[str, Any], list[str], list[str]]:
    """Hydra's group choices, the command line's overrides of this run, and, in a multirun, the overrides of the
    whole sweep (from its ``multirun.yaml``, where a swept key still has all its values); empty for a config
    composed in code."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return {}, [], []
    hydra_cfg = HydraConfig.get()
    sweep: list[str] = []
    sweep_file = Path(str(hydra_cfg.sweep.dir)) / "multirun.yaml"
    if hydra_cfg.mode == RunMode.MULTIRUN and sweep_file.is_file():
        sweep = list(OmegaConf.select(OmegaConf.load(sweep_file), "hydra.overrides.task", default=None) or [])
    return dict(hydra_cfg.runtime.choices), list(hydra_cfg.overrides.task), sweep


LAB_CONTROLLERS: dict[str, str] = {"entrocraft_hard": "band", "entrocraft": "band"}
"""Controller presets whose numbers are the lab's (nats of the Countdown task on the lab model) -> the key that holds
them. ``callbacks/default.yaml`` picks ``entrocraft_hard``; the data presets of other tasks pick ``none``."""
LAB_DATA = "countdown"


def lab_controller_advice(choices: dict[str, Any], overrides: list[str]) -> str | None:
    """A warning when a controller preset with the lab's band runs on another task with that band untouched
    (e.g. a data preset of one's own, which does not pick ``callbacks/entropy=none`` as the shipped ones do)."""
    controller, data = choices.get("callbacks/entropy"), choices.get("data")
    key = LAB_CONTROLLERS.get(str(controller))
    if key is None or data in (None, LAB_DATA) or any(o.startswith(f"callbacks.entropy.{key}") for o in overrides):
        return None
    return (f"callbacks/entropy={controller} keeps an entropy band set for the lab (data={LAB_DATA}, in its nats), "
            f"and this run is data={data}: it will push the entropy toward the lab's band. Start with "
            f"callbacks/entropy=none and look at rollout/entropy, or set callbacks.entropy.{key} for this task "
            "(docs/controllers/overview.md)")


def lightning_checkpointing(callbacks: list[Any]) -> dict[str, Any]:
    """``enable_checkpointing=False`` when no checkpoint callback is attached (``~callbacks.checkpoint``): Lightning
    would otherwise add its own, which writes a whole checkpoint (1.6 GB for SmolLM2) after every epoch."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    return {} if any(isinstance(c, ModelCheckpoint) for c in callbacks) else {"enable_checkpointing": False}


def build(cfg: DictConfig, engine: Any = None, resume_step: int | None = None,
          resume_iteration: int | None = None) -> tuple[pl.Trainer, Any, Any]:
    """The trainer, the module and the rollout DataModule of a composed config.

    ``engine`` replaces the ``rollout`` group's engine factory (e.g. to share one started engine
    between several fits in one process). ``resume_step``, ``resume_iteration``: see :func:`instantiate_loggers`.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    quiet_third_party(bool(cfg.get("verbose", False)))  # before the engine imports vLLM
    # The in-process vLLM engine initialises a one-process torch.distributed group, which makes
    # Lightning suggest sync_dist for every epoch-level metric; on one device it changes nothing.
    warnings.filterwarnings("ignore", message=".*sync_dist=True.*")
    pl.seed_everything(cfg.seed, workers=True)
    # Everything cheap first, so a bad value fails before the warm start or the engine start.
    spec = instantiate(cfg.model)
    algo, optim, batch = instantiate(cfg.algo), instantiate(cfg.optim), instantiate(cfg.batch)
    correction = instantiate(cfg.correction) if "correction" in cfg else None
    check_batch_and_algo(batch, algo)
    advice = unread_clip_advice(algo)
    if advice:
        log.warning(advice)
    if correction is not None:
        check_with_algo(correction, algo)
    sampler = build_sampler(cfg, engine)
    if sampler.sampling.greedy:
        raise ValueError("rollout.greedy=true: training needs sampled completions (a group of greedy ones is one "
                         "completion n times); greedy decoding is for evaluation (callbacks.eval, scripts/evaluate.py)")
    advice = staleness_advice(sampler.sampling.max_staleness, correction)
    if advice:
        log.warning(advice)
    datamodule = instantiate(cfg.data, _partial_=True)(sampler=sampler, batch=batch)
    check_prompts = getattr(spec, "check_prompts", None)  # the lab's character model reads only its alphabet
    if callable(check_prompts):
        check_prompts(datamodule.prompts, sampler.sampling.max_new_tokens)
    choices, overrides, sweep = hydra_context()
    advice = lab_controller_advice(choices, overrides)
    if advice:
        log.warning(advice)
    dashboard = RunDashboard(run_hparams(cfg, choices, overrides), varied_keys(overrides, sweep))
    # InterruptLatch: a swallowed Ctrl-C is raised again. RunDashboard last: it reads what the others logged.
    callbacks = instantiate_callbacks(cfg.get("callbacks")) + [InterruptLatch(), dashboard]
    check_knob_owners(callbacks, algo)
    check_controllers_and_algo(callbacks, algo)
    for callback in callbacks:  # the evaluation reads the rollout source's prompts and sampler: handed over here
        evaluate_from = getattr(callback, "evaluate_from", None)
        if callable(evaluate_from):
            evaluate_from(datamodule)
    drawers = draw_refusals(callbacks, sampler.sampling.max_staleness)
    if drawers:
        raise ValueError(f"{', '.join(drawers)} draws extra rows from the current weights, but rollout.max_staleness="
                         f"{sampler.sampling.max_staleness} samples ahead: use rollout.max_staleness=0")
    module = instantiate(cfg.module, policy=spec.build(), algo=algo, optim=optim, batch=batch, correction=correction,
                         _recursive_=False)
    loggers = instantiate_loggers(cfg.get("logger"), resume_step, resume_iteration)
    trainer: pl.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False,
                                      **lightning_checkpointing(callbacks))
    if loggers:
        for lg in loggers:
            lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    if rank() == 0:
        log.info("\n%s", startup_block(cfg, trainer))  # model=hf: the model's report came just before
        engine_dtype = ((cfg.get("rollout") or {}).get("engine") or {}).get("dtype")
        note = slow_half_precision_note(str(trainer.precision), engine_dtype,
                                        isinstance(trainer.accelerator, CPUAccelerator), cpu_half_support())
        if note:
            log.warning(note)
    return trainer, module, datamodule


@dataclass
class Fitted:
    """A finished fit: the objects it ran and its final metrics."""

    trainer: pl.Trainer
    module: Any
    datamodule: Any
    metrics: dict[str, float]
    """The final logged metrics as floats (all finite)."""


def fit(cfg: DictConfig, engine: Any = None) -> Fitted:
    """Fit one run of a composed config (what ``scripts/train.py`` does); ``engine`` as in :func:`build`.

    A ``ckpt_path`` is checked first (before the warm start and the engine start): a truncated, corrupt,
    unsafe (its pickle asks for code; ``trust_checkpoint=true`` overrides) or mid-iteration checkpoint is refused
    naming its path.
    """
    ckpt_path = cfg.get("ckpt_path")
    trust = bool(cfg.get("trust_checkpoint", False))
    special = ckpt_path in ("last", "hpc", "registry")  # Lightning resolves these names itself
    resume = check_resumable(ckpt_path, trust=trust) if ckpt_path and not special else {}
    try:
        trainer, module, datamodule = build(cfg, engine=engine, resume_step=resume.get("step"),
                                            resume_iteration=resume.get("iteration"))
    except Exception as err:
        explained = explain_target_error(err)
        if explained is err:
            raise
        raise explained from err
    try:  # weights-only, whatever torch's default: a checkpoint cannot run code (lit_entropy/utils/checkpointing.py)
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=not trust)
    finally:
        datamodule.close()
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    bad = [k for k, v in metrics.items() if not math.isfinite(v)]
    if bad:
        raise FloatingPointError(f"non-finite final metrics: {bad}")
    return Fitted(trainer, module, datamodule, metrics)


def run(cfg: DictConfig) -> dict[str, float]:
    """Fit one run (:func:`fit`); returns the final logged metrics as floats."""
    return fit(cfg).metrics
