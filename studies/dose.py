"""The dose of a method in a run: how much its lever acted, read back from the run's TensorBoard scalars.

A method whose lever never acted (Clip-Cov picking one token a step, a λ pinned near 0, a controller whose
rows were all kept) says nothing about its paper's claim; its study cells are labelled *not tested at this
dose* instead of getting a verdict (:mod:`studies.verdicts`). Per run (:func:`dose_metrics`):

* ``sel_frac``: mean over optimizer steps of ``train/masked_frac_<rule>``, the fraction of response tokens the
  selection rule detached (Clip-Cov), penalised (KL-Cov) or removed (Clip_B, Clip_V, forking);
* ``clipfrac_high``: mean ``train/clipfrac_high``, the fraction of tokens at PPO's upper clip (DAPO, ADAPO);
* ``eps_high_mean``, ``eps_high_final``, ``eps_at_clamp``: ADAPO's ``control/eps_high`` trajectory and the
  fraction of iterations it sat at ``eps_min`` or ``eps_max`` (from the run's ``.hydra/config.yaml``);
* ``lambda_mean`` (mean \\|λ\\|), ``lambda_final``, ``lambda_at_clamp`` (fraction of iterations with
  \\|λ\\| at ``lam_max``): REPO's ``control/repo_lambda``;
* ``m_neg_frac``, ``m_pos_frac``, ``m_active_frac``: the fraction of iterations (each as many optimizer steps)
  with Entrocraft's direction m = −1, +1, ≠ 0 (``control/direction``); ``kept_frac`` the mean
  ``control/entrocraft_kept_frac`` and ``dropped_frac = 1 − kept_frac`` (paper mode's rejected rows);
* every dose declared with a ``tag``: the mean of that tag over the run, under the dose's key (STARE's fraction of
  tokens reweighted, AEPO's fraction of rows replaced, TOPR's fraction of tokens truncated).

Per method, :data:`METHOD_DOSE` names the one of them that is *the* dose (the ``dose`` column) and the
threshold under which the method counts as not tested; each kind of method declares it where it is registered
(:func:`method_doses`).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from lit_entropy.callbacks import CONTROLLERS
from lit_entropy.dose import Dose
from lit_entropy.objectives.losses import LOSSES
from lit_entropy.objectives.registry import SELECTION_RULES

DoseRule = Dose
"""A method's dose rule (:class:`lit_entropy.callbacks.base.Dose`: the run-summary key, what it measures, the
threshold of *not tested*)."""
DOSE_THRESHOLD = Dose("", "").threshold
"""Under this dose (a fraction of tokens, rows or iterations; for REPO a mean |λ|) a method is not tested."""

_VERB = {"detach": "detached", "kl_selected": "penalised", "loss_mask": "removed"}


def method_doses() -> dict[str, Dose]:
    """Every method's dose, from where each kind of method is registered: a selection rule's is the fraction of
    response tokens its mask acts on (``train/masked_frac_<rule>``, :data:`~lit_entropy.objectives.registry.
    SELECTION_RULES`); a controller's is its class's own (:attr:`~lit_entropy.callbacks.base.EntropyController.
    methods`); a policy loss's its entry's (:attr:`~lit_entropy.objectives.losses.PolicyLoss.dose`, under the loss's
    name, which is its preset's); DAPO's, an objective preset's clip-higher, the fraction of tokens at the upper
    clip."""
    doses = {name: Dose("sel_frac", f"fraction of response tokens {_VERB[rule.effect]} (train/masked_frac_{name})")
             for name, rule in SELECTION_RULES.items()}
    doses.update({name: loss.dose for name, loss in LOSSES.items() if loss.dose is not None})
    doses["topr_paper"] = LOSSES["topr"].dose  # TOPR's loss in its paper's setting (±1 rewards, no baseline)
    doses["dapo"] = Dose("clipfrac_high", "fraction of tokens at the upper clip (train/clipfrac_high)")
    for cls in CONTROLLERS.values():
        doses.update({m: d for m, d in cls.methods.items() if d is not None})
    return doses


METHOD_DOSE: dict[str, Dose] = method_doses()
"""Method (a ``conf/algo`` preset or selection rule, or a ``conf/callbacks/entropy`` controller) -> its dose."""

DOSE_COLUMNS: dict[str, str] = {
    "dose": "dose", "sel_frac": "selected frac", "clipfrac_high": "clipfrac high", "eps_high_mean": "ε_high mean",
    "eps_high_final": "ε_high final", "eps_at_clamp": "ε at clamp", "lambda_mean": "|λ| mean",
    "lambda_final": "λ final", "lambda_at_clamp": "λ at clamp", "m_neg_frac": "m=−1 frac", "m_pos_frac": "m=+1 frac",
    "m_active_frac": "m≠0 frac", "kept_frac": "kept frac", "dropped_frac": "dropped frac",
    "pic_alpha_mean": "|α| mean", "entropy_coef_mean": "bonus coef mean",
}
"""The dose columns of the study table and their headings."""


def method_of(algo: str, controller: str) -> str:
    """The method a cell tests: its controller, or with no controller its objective (``algo@variant`` -> algo)."""
    return controller if controller not in ("", "none") else algo.partition("@")[0]


def method_from_config(cfg: dict[str, Any]) -> str:
    """The method of a run from its composed config: its controller's (the class named by the node's ``_target_``,
    asked :meth:`~lit_entropy.callbacks.base.EntropyController.method_of`), else ``algo.selection``, else
    ``algo.name``."""
    node = (cfg.get("callbacks") or {}).get("entropy") or {}
    controller = CONTROLLERS.get(str(node.get("_target_", "")).rsplit(".", 1)[-1])
    if controller is not None:
        return controller.method_of(node)
    algo = cfg.get("algo") or {}
    return str(algo.get("selection") or algo.get("name") or "")


def run_config(folder: str | Path) -> dict[str, Any]:
    """The run's composed config (``.hydra/config.yaml``), or ``{}``."""
    import yaml

    f = Path(folder) / ".hydra" / "config.yaml"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where PyYAML has it: ~10x faster,
    return (yaml.load(f.read_text(), Loader=loader) or {}) if f.is_file() else {}  # and the same objects


def _mean(xs: list[float] | None) -> float | None:
    return statistics.mean(xs) if xs else None


def _frac(xs: list[float] | None, hit) -> float | None:
    return sum(1 for x in xs if hit(x)) / len(xs) if xs else None


def dose_metrics(s: dict[str, list[float]], cfg: dict[str, Any] | None = None) -> dict[str, float | None]:
    """Every dose metric of one run (None where the run did not log its tag); ``s``: tag -> values in step
    order, ``cfg``: the run's config (for the clamps of ADAPO's ε_high and REPO's λ)."""
    ctl = ((cfg or {}).get("callbacks") or {}).get("entropy") or {}
    sel = [t for t in s if t.startswith("train/masked_frac_") and s[t]]
    eps, lam, m = s.get("control/eps_high"), s.get("control/repo_lambda"), s.get("control/direction")
    kept = _mean(s.get("control/entrocraft_kept_frac"))
    tol = 1e-9
    eps_lo, eps_hi, lam_max = ctl.get("eps_min"), ctl.get("eps_max"), ctl.get("lam_max")
    return {
        "sel_frac": _mean(s[sel[0]]) if sel else None,
        "clipfrac_high": _mean(s.get("train/clipfrac_high")),
        "eps_high_mean": _mean(eps),
        "eps_high_final": eps[-1] if eps else None,
        "eps_at_clamp": _frac(eps, lambda x: any(b is not None and abs(x - b) < tol for b in (eps_lo, eps_hi)))
        if eps_lo is not None or eps_hi is not None else None,
        "lambda_mean": _mean([abs(x) for x in lam]) if lam else None,
        "lambda_final": lam[-1] if lam else None,
        "lambda_at_clamp": _frac(lam, lambda x: abs(x) >= lam_max * (1 - 1e-6)) if lam_max is not None else None,
        "m_neg_frac": _frac(m, lambda x: x < 0),
        "m_pos_frac": _frac(m, lambda x: x > 0),
        "m_active_frac": _frac(m, lambda x: x != 0),
        "kept_frac": kept,
        "dropped_frac": 1.0 - kept if kept is not None else None,
        "pic_alpha_mean": _mean([abs(x) for x in s["control/pic_alpha"]]) if s.get("control/pic_alpha") else None,
        "entropy_coef_mean": _mean(s.get("control/entropy_coef")),
        **{d.key: _mean(_tagged(s, d)[1]) for d in METHOD_DOSE.values() if d.tag is not None},
    }


def _tagged(s: dict[str, list[float]], dose: Dose) -> tuple[str, list[float] | None]:
    """The dose's tag and its values in ``s``: its own ``tag``, else the first of its ``legacy_tags`` the run
    logged (records of earlier commits)."""
    for tag in (dose.tag, *dose.legacy_tags):
        if tag and s.get(tag):
            return tag, s[tag]
    return dose.tag or "", None


def method_dose(method: str, summary: dict[str, Any]) -> float | None:
    """The method's dose in one run summary (None: a method with no dose rule, e.g. plain GRPO, or not logged)."""
    rule = METHOD_DOSE.get(method)
    return summary.get(rule.key) if rule is not None else None


def dose_given(method: str, doses: list[float | None]) -> bool | None:
    """Whether the method was given its dose over these runs (mean dose >= its threshold); None when the
    method has no dose rule (the baseline) or no run logged it."""
    rule, xs = METHOD_DOSE.get(method), [d for d in doses if d is not None]
    if rule is None or not xs:
        return None
    return statistics.mean(xs) >= rule.threshold


NOT_TESTED = "not tested at this dose"


def dose_cell(method: str, doses: list[float | None]) -> str:
    """The table's dose cell: mean ± sd over the runs, and *not tested at this dose* under the threshold."""
    xs = [d for d in doses if d is not None]
    if not xs:
        return "—"
    text = f"{statistics.mean(xs):.4f}" + (f" ± {statistics.stdev(xs):.4f}" if len(xs) > 1 else "")
    return text + (f" ({NOT_TESTED})" if dose_given(method, xs) is False else "")


def dose_legend(methods: list[str]) -> str:
    """One line per method present: what its dose measures and its threshold."""
    lines = [f"- dose of `{m}`: {METHOD_DOSE[m].what}; under {METHOD_DOSE[m].threshold:g}: {NOT_TESTED}"
             for m in dict.fromkeys(methods) if m in METHOD_DOSE]
    return "\n".join(lines)


_SERIES: dict[str, tuple[str, str, Any]] = {
    "clipfrac_high": ("train/clipfrac_high", "train/clipfrac_high", None),
    "lambda_mean": ("control/repo_lambda", "control/repo_lambda", None),  # signed: which way λ pushes, not only how hard
    "m_active_frac": ("control/direction", "m ≠ 0", lambda m: float(m != 0)),
    "dropped_frac": ("control/entrocraft_kept_frac", "1 − kept", lambda kept: 1.0 - kept),
    "pic_alpha_mean": ("control/pic_alpha", "control/pic_alpha", None),
    "entropy_coef_mean": ("control/entropy_coef", "control/entropy_coef", None),
}
"""Dose key -> the scalar behind it, its name in the trajectory table and the map of each logged value (None: as
logged). The selection rules' ``train/masked_frac_<rule>`` and the doses declared with a ``tag`` are found apart."""


def dose_series(method: str, s: dict[str, list[float]]) -> list[tuple[str, list[float]]]:
    """The scalars behind ``method``'s dose in one run, as ``(name, values in step order)``: its dose's own tag
    (``m≠0`` for Entrocraft's direction, ``1 − kept`` for its dropped rows, the signed λ for REPO), and ADAPO's
    ``control/eps_high`` where the run logged it. Empty for a method without a dose rule or a run that did not
    log it."""
    rule = METHOD_DOSE.get(method)
    got: list[tuple[str, list[float]]] = []
    if rule is not None:
        if rule.key == "sel_frac":
            tag = next((t for t in s if t.startswith("train/masked_frac_") and s[t]), "")
            name, fn = tag, None
        else:
            found = _tagged(s, rule)[0]
            tag, name, fn = _SERIES.get(rule.key, (found, found, None))
        if s.get(tag):
            got.append((name, [fn(x) for x in s[tag]] if fn else list(s[tag])))
    if s.get("control/eps_high"):
        got.append(("control/eps_high", list(s["control/eps_high"])))
    return got


def window_means(xs: list[float], iterations: int, window: int) -> list[float]:
    """Means of ``xs`` over consecutive windows of ``window`` RL iterations, for a run of ``iterations``
    iterations. ``xs`` is per iteration or per optimizer step (as many a step as an iteration: ``len(xs)`` a
    multiple of ``iterations``); value i belongs to iteration ``i * iterations // len(xs)``. The last window may
    be shorter (a run stopped early)."""
    if not xs or iterations <= 0:
        return []
    buckets: dict[int, list[float]] = {}
    for i, x in enumerate(xs):
        buckets.setdefault(i * iterations // len(xs) // window, []).append(x)
    return [statistics.mean(buckets[b]) for b in sorted(buckets)]
