"""A method's dose: how much its lever acted over a run (the studies' *not tested at this dose* rule).

Every kind of method declares its dose where it is registered (a controller's :attr:`~lit_entropy.callbacks.base.
EntropyController.methods`, a policy loss's :attr:`~lit_entropy.objectives.losses.PolicyLoss.dose`); ``studies/dose.py``
reads them back from a finished run's TensorBoard scalars.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dose:
    """How much a method's lever acted over a run: a run-summary key of :func:`studies.dose.dose_metrics`, what it
    measures, and the level under which the method counts as not tested."""

    key: str
    """The run-summary key (``studies.dose.dose_metrics``) that holds the dose."""
    what: str
    """What it measures, in words, for the study's legend."""
    threshold: float = 1e-3
    """Under this mean the method's claims are *not tested at this dose*."""
    tag: str | None = None
    """A logged scalar whose mean over the run is the dose (``key`` is then filled from it); None for the doses
    ``dose_metrics`` computes itself from several tags or from the run's config."""
    legacy_tags: tuple[str, ...] = ()
    """Tags runs of earlier commits logged the same dose under, read where ``tag`` is missing (their records)."""
