"""Entropy controllers, installed as ``lit_entropy.callbacks`` (one controller per file).

Every controller subclasses :class:`EntropyController` (``base.py``) and acts in the
``on_rollout_batch(trainer, pl_module, batch)`` hook; see ``docs/controllers/``.
"""

from lit_entropy.callbacks.adapo import ADAPOCallback
from lit_entropy.callbacks.adaptive_bonus import AdaptiveEntropyBonusCallback
from lit_entropy.callbacks.base import EntropyController
from lit_entropy.callbacks.diagnostics import EntropyDiagnosticsCallback
from lit_entropy.callbacks.entrocraft import EntrocraftCallback
from lit_entropy.callbacks.entropic import EntroPICCallback
from lit_entropy.callbacks.entropy_law import EntropyLawCallback
from lit_entropy.callbacks.gppo_beta import GPPOBetaCallback
from lit_entropy.callbacks.repo import REPOCallback

__all__ = [
    "ADAPOCallback",
    "AdaptiveEntropyBonusCallback",
    "EntroPICCallback",
    "EntrocraftCallback",
    "EntropyController",
    "EntropyDiagnosticsCallback",
    "EntropyLawCallback",
    "GPPOBetaCallback",
    "REPOCallback",
]
