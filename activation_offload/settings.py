"""Grouped settings of :class:`~tensorpress.activation_offload.ActivationCompression`.

``Adaptive``: per-layer bounds that follow gradient statistics (``adaptive.py``).
``Offload``: where held bytes go until backward (a :class:`TieredStore`).
The opt-in rules' settings, ``Rules``, are in ``rules.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .store.tiered import TieredStore

DEFAULT_CEILING = 5.0  # adaptive bounds reach at most this many times the given bound


@dataclass(frozen=True)
class Adaptive:
    """Per-layer bounds between the given bound and ``ceiling`` (same unit as the bound;
    None: ``DEFAULT_CEILING`` times it), re-derived every ``update_every`` forward
    passes so each layer's gradient error stays near ``gradient_error`` (relative)."""

    ceiling: float | None = None
    gradient_error: float = 1e-3
    update_every: int = 50

    def __post_init__(self):
        if not (isinstance(self.gradient_error, (int, float)) and self.gradient_error > 0):
            raise ValueError(
                f"gradient_error must be a positive number, got {self.gradient_error!r}"
            )
        if not (isinstance(self.update_every, int) and self.update_every > 0):
            raise ValueError(f"update_every must be a positive integer, got {self.update_every!r}")


@dataclass(frozen=True)
class Offload:
    """Held bytes (payloads; with ``codec=None`` the tensors, exactly) move out of device
    memory into ``store`` until backward, which prefetches ``prefetch`` records ahead in
    the reverse order of the forward pass. ``store`` None: a CPU-only store of a quarter
    of the machine's memory, made when the settings are used."""

    store: TieredStore | None = None
    prefetch: int = 2

    def __post_init__(self):
        if self.store is not None and not isinstance(self.store, TieredStore):
            raise TypeError(f"store must be a TieredStore, got {type(self.store).__name__}")
        if not (isinstance(self.prefetch, int) and self.prefetch >= 0):
            raise ValueError(f"prefetch must be a non-negative integer, got {self.prefetch!r}")

    def resolve(self) -> TieredStore:
        """The store to use: ``store``, or a new CPU store of a quarter of the memory."""
        if self.store is not None:
            return self.store
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return TieredStore(memory // 4)


def as_offload(offload) -> Offload | None:
    """``offload`` as :class:`Offload` settings: a bare :class:`TieredStore` is
    ``Offload(store)``; None is no offload."""
    if offload is None or isinstance(offload, Offload):
        return offload
    if isinstance(offload, TieredStore):
        return Offload(offload)
    raise TypeError(
        f"offload takes Offload(...), a TieredStore or None, got {type(offload).__name__}"
    )


def as_adaptive(adaptive) -> Adaptive | None:
    """``adaptive`` as :class:`Adaptive` settings (True: the defaults; False/None: off)."""
    if adaptive is None or adaptive is False:
        return None
    if adaptive is True:
        return Adaptive()
    if isinstance(adaptive, Adaptive):
        return adaptive
    raise TypeError(f"adaptive takes Adaptive(...), True or False, got {adaptive!r}")


def adaptive_ceiling(config: dict, bounds: dict) -> dict:
    """``config`` with its adaptive ceiling checked (and defaulted) against its bound."""
    if not ("abs" in bounds or "rel" in bounds):
        raise ValueError("adaptive bounds need an error-bounded codec with abs= or rel=")
    ((mode, value),) = bounds.items()
    if config["ceiling"] is None:
        config = dict(config, ceiling=DEFAULT_CEILING * value)
    if not (isinstance(config["ceiling"], (int, float)) and config["ceiling"] >= value):
        raise ValueError(
            f"ceiling must be a number no smaller than {mode}={value}, got {config['ceiling']!r}"
        )
    return config
