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
    "CompiledCompression",
    "CompressedActivations",
    "Handle",
    "HostMemoryFull",
    "Offload",
    "OptimizerOffload",
    "Rules",
    "StoreStats",
    "TieredStore",
    "apply_activation_compression",
    "compile_with_compression",
    "offload_activations",
    "offload_optimizer_state",
    "selective_checkpoint_contexts",
    "wrap",
]


def __getattr__(name):
    # the compiled-graph pass imports inductor, seconds of work: only when asked for
    if name in ("CompiledCompression", "compile_with_compression"):
        from . import compiled

        return getattr(compiled, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
