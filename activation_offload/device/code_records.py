"""Saved tensors held as device codes (``codes.py``): no host waits.

(The eager hooks hold block codes by default, ``tile_records.py``; this record
is ``device_layout="fixed"``.)

A record made here is compressed and restored by two ``torch.library`` custom ops
that read nothing back to the host: the code width follows from the ``rel`` bound
alone and the tensor's range stays on the device. The device path
(``device_codes_apply``) takes float16, bfloat16 and float32 tensors on any device but
the CPU (CUDA; meta tensors in the tests), or on every device with ``device_path=True``
(``device_path=False`` never): under a plain ``rel`` bound in every layout; under
``abs`` and adaptive bounds in block codes, with a store or without
(``bounds.py`` says which bound each tensor gets there). Everything else keeps
the existing path.

On this path the host never learns a record's absolute bound, so what needs one is
left out for its tensors: the derived-tensor rules (norms, views of held memory; a GELU's
output is held as a residual instead, in block codes, ``gelu.py``), the int8
codes and the zstd stage; a loss's log-probabilities (held within an absolute bound under
``rel``) are kept as they are by the fixed codes, and held under ``abs`` by block codes;
the stats show no tolerance for ``rel`` records. Each of these holds fewer bytes only
where the data allows, and a sound fallback where it does not needs a host read before
the tensor's memory is released (``codes.py`` says why), so they stay on
the existing path.
"""

from __future__ import annotations

import torch

from ...compress.bounds import ErrorBound
from ..identity import VersionWatch
from ..records import Held, Watched, check_restored
from ..stats import ActivationStats
from .bounds import rel_abs
from .codes import DTYPES, DeviceCodes, compress_codes, restore_codes, supports
from .stochastic import stochastic_device, stochastic_supports


def device_codes_apply(config: dict, bound: ErrorBound | None, t: torch.Tensor) -> bool:
    """Whether ``t`` is held on the device path under the settings ``config`` and the
    bound ``bound`` (unresolved, or None); with the fixed layout only under a plain
    ``rel`` bound (those records hold nothing else): ``abs`` and adaptive bounds go to
    block codes."""
    choice = config.get("device_path")
    if choice is False or (choice is None and t.device.type == "cpu"):
        return False
    rel, abs_ = rel_abs(bound)
    if stochastic_device(config):  # stochastic codes: plain rel bounds only
        return rel is not None and not config["adaptive"] and stochastic_supports(t.dtype, rel)
    if rel is not None and not config["adaptive"]:
        return supports(t.dtype, rel)
    if config.get("device_layout", "blocks") != "blocks":
        return False
    if abs_ is not None:
        return t.dtype in DTYPES
    return supports(t.dtype, rel)


def keeps_log_probs(config: dict) -> bool:
    """Whether the device path keeps a loss's log-probabilities as they are: they get an
    absolute bound, which only block codes hold."""
    return config.get("device_layout", "blocks") != "blocks"


def check_device_path(choice) -> None:
    """Raise ValueError unless ``choice`` is a ``device_path`` setting."""
    if choice not in (None, True, False):
        raise ValueError(f"device_path takes None, True or False, got {choice!r}")


class DeviceCompressed(Watched, Held):
    """A tensor held as :class:`DeviceCodes` on its device, within ``rel`` of its range."""

    __slots__ = ("codes", "watch", "name", "original")
    mode = "rel"
    tolerance = None  # the absolute bound is a device scalar: the host does not learn it
    error = None

    def __init__(self, t, rel: float, stats: ActivationStats, name: str, debug: bool):
        self.codes: DeviceCodes = compress_codes(t, rel)
        self.watch = VersionWatch(t)
        self.name = name
        self.original = t.detach().clone() if debug else None
        super().__init__(self.codes.nbytes, stats)

    def restore(self) -> torch.Tensor:
        if self._keep is not None:
            return self._keep
        return restore_codes(self.codes)

    def check(self, y: torch.Tensor) -> None:
        """Raise AssertionError where ``y`` breaks the bound (debug mode reads the range)."""
        if self.original is None:
            return
        lo, hi, _ = self.codes.scalars.tolist()
        tol = self.codes.rel * (hi - lo)
        check_restored(self.name, self.original, y, tol, tol)
