"""Activation compression and tiered offload (saved-tensor hooks)."""

from .._util.optional_torch import torch as _torch  # noqa: F401  (install advice)
from .hooks import ActivationCompression, CompressedActivations, offload_activations, wrap
from .per_block import BlockCompression, apply_activation_compression
from .rules import RULES, Rules
from .selective import selective_checkpoint_contexts
from .settings import Adaptive, Offload
from .stats import ActivationStats
from .store.optimizer import OptimizerOffload, offload_optimizer_state
from .store.tiered import Handle, HostMemoryFull, StoreStats, TieredStore

__all__ = [
    "RULES",
    "ActivationCompression",
    "ActivationStats",
    "Adaptive",
    "BlockCompression",
    "CompressedActivations",
    "Handle",
    "HostMemoryFull",
    "Offload",
    "OptimizerOffload",
    "Rules",
    "StoreStats",
    "TieredStore",
    "apply_activation_compression",
    "offload_activations",
    "offload_optimizer_state",
    "selective_checkpoint_contexts",
    "wrap",
]
