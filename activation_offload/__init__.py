"""Activation compression and tiered offload (saved-tensor hooks)."""

from .adaptive import AdaptiveBounds
from .hooks import ActivationCompression, CompressedActivations, wrap
from .stats import ActivationStats, ModuleRow

__all__ = [
    "ActivationCompression",
    "ActivationStats",
    "AdaptiveBounds",
    "CompressedActivations",
    "ModuleRow",
    "wrap",
]
