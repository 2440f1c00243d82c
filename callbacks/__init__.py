"""Entropy controllers and diagnostics callbacks, installed as ``lit_entropy.callbacks``."""

from lit_entropy.callbacks.entrocraft import EntrocraftCallback

__all__ = ["EntrocraftCallback"]
