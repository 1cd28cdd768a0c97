"""A GELU's output held as GELU of its input's record: no bytes of its own.

A transformer's MLP saves its GELU's input (for GELU's backward) and its output (for
the next linear layer's): two tensors of the MLP's width, the widest of the block.
GELU changes by at most ``GELU_LIPSCHITZ`` times a change of its input, so an input
restored within ``e`` gives an output within ``1.13 e``, plus a few units in the last
place of the float arithmetic (``rounding_slack``). When that meets the output's own
bound, the output is restored as GELU of the restored input. To make it meet, the
input of an ``nn.GELU`` module is held within its output's smallest bound over 1.13
(see :func:`input_tolerance`), if that is tighter than its own.

float16 and bfloat16 tensors are compressed as they are: their rounding is too
coarse for the slack.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..compress.tensor import finite_range
from .identity import VersionWatch
from .records import Held, check_restored
from .stats import ActivationStats

#: the largest |GELU'(x)|: 1.12890 exact, 1.12899 with the tanh approximation
GELU_LIPSCHITZ = 1.13
_EXACT = (torch.float32, torch.float64)
_GELU_OUTPUT = "GeluBackward0"
#: nodes of reshapes (a linear layer flattens its input to 2-d): the same values in C order
_RESHAPES = frozenset({"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0"})


def rounding_slack(dtype: torch.dtype, magnitude: float) -> float:
    """A bound on the float error of GELU of a value of size up to ``magnitude``,
    computed twice (once for the output, once to restore it): 8 units in the last
    place."""
    return 8.0 * magnitude * torch.finfo(dtype).eps


def input_tolerance(t: torch.Tensor, tol: float, rel: float | None) -> tuple[float, float]:
    """(tolerance, magnitude) for GELU's input ``t`` (its own tolerance: ``tol``): the
    tolerance lets its output be derived, whose bound is ``tol`` under ``abs`` and at
    least ``rel`` times |GELU(max) - GELU(min)| under ``rel`` (both ends are outputs it
    holds); the magnitude bounds the output's finite values."""
    if t.dtype not in _EXACT:
        return tol, math.inf
    lo, hi = finite_range(t)
    ends = F.gelu(torch.tensor([lo, hi], dtype=t.dtype)).tolist()
    floor = tol if rel is None else rel * abs(ends[1] - ends[0])
    magnitude = max(abs(ends[0]), abs(ends[1]), 0.17)  # GELU's minimum is -0.17
    room = floor * (1 - 2**-10) - rounding_slack(t.dtype, magnitude)  # ulps of the ends
    return (min(tol, room / GELU_LIPSCHITZ) if room > 0 else tol), magnitude


class GeluInputs:
    """The records of the GELU inputs held during one forward pass, by the autograd
    node that made them (a GELU output's node names its input's)."""

    def __init__(self):
        self._by_node: dict = {}  # node -> (record, output_nr, magnitude); per forward

    def add(self, t: torch.Tensor, rec, magnitude: float) -> None:
        """Note ``rec``, held for GELU's input ``t``, whose output's finite values are at
        most ``magnitude`` in size."""
        if t.grad_fn is not None:
            self._by_node[t.grad_fn] = (rec, t.output_nr, magnitude)

    def clear(self) -> None:
        self._by_node.clear()

    def derive(self, t, tol: float, stats: ActivationStats, name: str, debug: bool):
        """A :class:`Derived` record for ``t`` if it is GELU's output whose input is held
        tightly enough for ``tol``; else None."""
        fn = t.grad_fn
        if type(fn).__name__ in _RESHAPES:  # GELU's output reshaped: GELU's node is next
            fn = fn.next_functions[0][0]
        if type(fn).__name__ != _GELU_OUTPUT or t.dtype not in _EXACT:
            return None
        node, nr = fn.next_functions[0]
        rec, source_nr, magnitude = self._by_node.get(node, (None, None, None))
        if rec is None or source_nr != nr or rec.current_version() != rec.version:
            return None
        if math.prod(rec.shape) != t.numel() or rec.dtype != t.dtype or rec.mode != "abs":
            return None
        error = GELU_LIPSCHITZ * rec.tolerance + rounding_slack(t.dtype, magnitude)
        if not error <= tol:
            return None
        return Derived(t, rec, fn._saved_approximate, tol, error, stats, name, debug)


class Derived(Held):
    """GELU of another record (``source``); holds no bytes of its own. ``tolerance``:
    the bound promised; ``error``: the bound it keeps (no larger)."""

    __slots__ = ("source", "approximate", "shape", "tolerance", "error", "watch", "name")
    __slots__ += ("original",)

    def __init__(self, t, source, approximate, tol, error, stats, name, debug):
        super().__init__(0, stats)
        self.source, self.approximate, self.shape = source, approximate, tuple(t.shape)
        self.tolerance, self.error, self.name = tol, error, name
        self.watch = VersionWatch(t)
        self.original = t.detach().clone() if debug else None

    @property
    def version(self) -> int:
        return self.watch.version

    def current_version(self) -> int:
        return self.watch.current

    def restore(self) -> torch.Tensor:
        if self._keep is not None:
            return self._keep
        x = self.source.restore()
        self.source.keep_restored(x)  # GELU's own backward, next, takes it from there
        return F.gelu(x, approximate=self.approximate).reshape(self.shape)

    def check(self, y: torch.Tensor) -> None:
        """Raise AssertionError where ``y`` breaks the bound (debug mode)."""
        if self.original is not None:
            # GELU of a very negative input underflows to zero, or nearly: zeros may move
            check_restored(self.name, self.original, y, self.tolerance, self.tolerance, False)
