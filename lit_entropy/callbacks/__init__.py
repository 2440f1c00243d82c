"""Lightning callbacks: the entropy controllers (one file each, every one a subclass of
:class:`~lit_entropy.callbacks.base.EntropyController`, registered in :data:`CONTROLLERS` by subclassing), the
diagnostics, the law fit, the periodic evaluation, progress and checkpoints; see ``docs/controllers/``.

Every module of this folder is imported here, so a new controller is its file and its YAML
(``conf/callbacks/entropy/<name>.yaml``) and nothing else.
"""

import importlib
import pkgutil

from lit_entropy.callbacks.adapo import ADAPOCallback
from lit_entropy.callbacks.adaptive_bonus import AdaptiveEntropyBonusCallback
from lit_entropy.callbacks.base import CONTROLLERS, Dose, EntropyController
from lit_entropy.callbacks.diagnostics import EntropyDiagnosticsCallback
from lit_entropy.callbacks.entrocraft import EntrocraftCallback
from lit_entropy.callbacks.entropic import EntroPICCallback
from lit_entropy.callbacks.entropy_law import EntropyLawCallback
from lit_entropy.callbacks.gppo_beta import GPPOBetaCallback
from lit_entropy.callbacks.repo import REPOCallback

for _module in pkgutil.iter_modules(__path__):  # a controller file added later registers itself on import
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "ADAPOCallback",
    "AdaptiveEntropyBonusCallback",
    "CONTROLLERS",
    "Dose",
    "EntroPICCallback",
    "EntrocraftCallback",
    "EntropyController",
    "EntropyDiagnosticsCallback",
    "EntropyLawCallback",
    "GPPOBetaCallback",
    "REPOCallback",
]
