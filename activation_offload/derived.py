"""Outputs held as functions of other records: no codec bytes of their own.

A GELU's output as GELU of its input's record. A transformer's MLP saves its
GELU's input (for GELU's backward) and its output (for the next linear layer's): two
tensors of the MLP's width, the widest of the block. GELU changes by at most
``GELU_LIPSCHITZ`` times a change of its input, so an input restored within ``e``
gives an output within ``1.13 e``, plus a few units in the last place of the float
arithmetic (``rounding_slack``). When that meets the output's own bound, the output
is restored as GELU of the restored input. To make it meet, the input of an
``nn.GELU`` module is held within its output's smallest bound over 1.13 (see
:func:`input_tolerance`), if that is tighter than its own.

A ReLU's output after a batch norm (training mode) as ReLU of the norm of its input's
record. The norm is ``x * alpha + beta`` per channel (``alpha`` = invstd times the
weight, ``beta`` = bias minus mean times ``alpha``, from the statistics the norm saved),
so an input within ``e`` gives an output within ``max|alpha| e`` plus rounding. A
1-bit mask of the positive outputs keeps ReLU's backward exact: zeros stay zero and
positives positive. The bound the norm's input needs is learned from the last
forward pass (``BatchNormInputs.tolerance``); where it is not met yet, the output is
compressed as any other.

A layer norm's output (which the next linear layer saves) as the norm of its input's
record, ``(x - mean) * rstd * weight + bias`` with the per-row statistics the norm
saved: within ``max(rstd) max|weight| e`` plus rounding, its input's bound learned
the same way.

float16 and bfloat16 tensors are compressed as they are: their rounding is too
coarse for the slack.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..compress.bounds import ErrorBound
from ..compress.tensor import ValueRange
from . import kernels
from .identity import VersionWatch
from .records import Compressed, Held, Watched, check_restored, pack_bits, unpack_bits
from .stats import ActivationStats

#: the largest |GELU'(x)|: 1.12890 exact, 1.12899 with the tanh approximation
GELU_LIPSCHITZ = 1.13
_EXACT = (torch.float32, torch.float64)
#: the autograd node names the rules key on (``rules.py``)
GELU_NODE = "GeluBackward0"
RELU_NODE = "ReluBackward0"
BATCH_NORM_NODE = "NativeBatchNormBackward0"
LAYER_NORM_NODE = "NativeLayerNormBackward0"
#: nodes of reshapes (a linear layer flattens its input to 2-d): the same values in C order
RESHAPES = frozenset({"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0"})


def rounding_slack(dtype: torch.dtype, magnitude: float) -> float:
    """A bound on the float error of a function (GELU, a norm) whose terms are of size
    up to ``magnitude``, computed twice (once for the output, once to restore it): 8
    units in the last place."""
    return 8.0 * magnitude * torch.finfo(dtype).eps


def needed_bound(tol: float, slack: float, gain: float) -> float | None:
    """The bound an input needs for an output that moves by at most ``gain`` times the
    input's change plus ``slack`` to keep ``tol``, with a tenth spare (the next pass's
    values move); None where no bound would do."""
    room = tol * (1 - 2**-10) - slack
    return 0.9 * room / gain if room > 0 and 0 < gain < math.inf else None


def input_tolerance(
    t: torch.Tensor, tol: float, bound: ErrorBound, span: ValueRange
) -> tuple[float, float]:
    """(tolerance, magnitude) for GELU's input ``t`` (its own tolerance: ``tol``; its
    values' range: ``span``; the bound, unresolved: ``bound``): the tolerance lets its
    output be derived, whose bound is ``tol`` under ``abs`` and at least ``bound``
    resolved over [GELU(min), GELU(max)] under ``rel`` (both ends are outputs it holds);
    the magnitude bounds the output's finite values."""
    if t.dtype not in _EXACT:
        return tol, math.inf
    lo, hi = span.finite
    ends = F.gelu(torch.tensor([lo, hi], dtype=t.dtype)).tolist()
    floor = tol if bound.mode != "rel" else bound.resolve_range(min(ends), max(ends)).tolerance
    magnitude = max(abs(ends[0]), abs(ends[1]), 0.17)  # GELU's minimum is -0.17
    room = floor * (1 - 2**-10) - rounding_slack(t.dtype, magnitude)  # ulps of the ends
    return (min(tol, room / GELU_LIPSCHITZ) if room > 0 else tol), magnitude


class _Inputs:
    """The records of one kind of input held during one forward pass, by the autograd
    node that made them: an output's node leads to the node of the function that made
    it, whose input names them."""

    def __init__(self):
        self._by_node: dict = {}  # node -> (record, output_nr, magnitude, module); per pass

    def _note(self, t: torch.Tensor, rec, magnitude: float, module=None) -> None:
        if t.grad_fn is not None:
            self._by_node[t.grad_fn] = (rec, t.output_nr, magnitude, module)

    def clear(self) -> None:
        self._by_node.clear()

    def _source(self, fn, t):
        """(record, magnitude, module) of the input of autograd node ``fn``, if held here
        under ``abs``, not modified since, and of ``t``'s size and dtype; else None."""
        node, nr = fn.next_functions[0]
        rec, source_nr, magnitude, module = self._by_node.get(node, (None,) * 4)
        if rec is None or source_nr != nr or rec.current_version() != rec.version:
            return None
        if rec.mode != "abs" or rec.dtype != t.dtype or math.prod(rec.shape) != t.numel():
            return None
        return rec, magnitude, module

    def _made_by(self, t, node_name: str):
        """(autograd node, record, magnitude, module) when ``t`` (or the reshape of it a
        linear layer saves) is the output of a ``node_name`` node whose input is held
        here; else None."""
        fn = t.grad_fn
        if type(fn).__name__ in RESHAPES:  # a linear layer flattens its input
            fn = fn.next_functions[0][0]
        if type(fn).__name__ != node_name or t.dtype not in _EXACT:
            return None
        source = self._source(fn, t)
        return None if source is None else (fn, *source)


class GeluInputs(_Inputs):
    """The inputs of GELUs, whose outputs are derived (:class:`GeluOfInput`)."""

    def add(self, t: torch.Tensor, rec, magnitude: float) -> None:
        """Note ``rec``, held for GELU's input ``t``, whose output's finite values are at
        most ``magnitude`` in size."""
        self._note(t, rec, magnitude)

    def output_span(self, t: torch.Tensor):
        """For GELU's output ``t`` whose input is held with its range: a stand-in for
        ``t``'s ValueRange whose span is at most ``t``'s (so a bound relative to it is no
        looser), from GELU of the input's ends, which are outputs ``t`` holds (no pass
        over ``t``); else None."""
        made = self._made_by(t, GELU_NODE)
        span = None if made is None else getattr(made[1], "span", None)
        if span is None:
            return None
        lo, hi = span.finite
        ends = torch.tensor([lo, hi], dtype=torch.float64)
        ends = F.gelu(ends, approximate=made[0]._saved_approximate).tolist()
        # less the float error of t's own GELU of those ends, each way: its terms
        # (x / 2 and x / 2 * erf) are of the input's size, not the output's
        terms = max(abs(lo), abs(hi), *map(abs, ends))
        width = abs(ends[1] - ends[0]) - 2 * rounding_slack(t.dtype, terms)
        return _Span((0.0, max(width, 0.0)))

    def derive(self, t, tol: float, stats: ActivationStats, name: str, debug: bool):
        """A :class:`GeluOfInput` record for ``t`` if it is GELU's output whose input is held
        tightly enough for ``tol``; else None."""
        made = self._made_by(t, GELU_NODE)
        if made is None:
            return None
        fn, rec, magnitude, _ = made
        error = GELU_LIPSCHITZ * rec.error + rounding_slack(t.dtype, magnitude)
        if not error <= tol:
            return None
        return GeluOfInput(t, rec, fn._saved_approximate, tol, error, stats, name, debug)


class _Span:
    """Ends standing in for a :class:`ValueRange`'s (``finite``)."""

    def __init__(self, finite: tuple[float, float]):
        self.finite = finite


class _NormInputs(_Inputs):
    """The inputs of one kind of norm, and the bound each norm's input needs for its
    output to be derived, learned from the last pass that tried."""

    def __init__(self):
        super().__init__()
        self._needed: dict = {}  # norm's name -> tolerance of its input

    def takes(self, module) -> bool:
        """Whether ``module`` is a norm of this kind whose output can be derived."""
        raise NotImplementedError

    def statistics(self, t: torch.Tensor, module) -> bool:
        """Whether ``t``, saved by the norm ``module``, is one of its statistics (which
        a derived output needs exactly)."""
        raise NotImplementedError

    def tolerance(self, name: str, tol: float) -> float:
        """The tolerance for the input of the norm ``name`` (its own: ``tol``)."""
        return min(tol, self._needed.get(name, math.inf))

    def add(self, t: torch.Tensor, rec, module, span: ValueRange) -> None:
        """Note ``rec``, held for the input ``t`` of the norm module ``module``, if ``t``
        is float32/64 and finite (its largest magnitude, from ``span``, enters the
        rounding slack)."""
        if t.grad_fn is None or t.dtype not in _EXACT or t.dim() < 2 or t.numel() == 0:
            return
        lo, hi = span.ends
        magnitude = max(abs(lo), abs(hi))
        if math.isfinite(magnitude):  # NaN and infinities would not survive the norm
            self._note(t, rec, magnitude, module)

    def _error(self, t, rec, tol: float, gain: float, size: float) -> float | None:
        """The bound an output keeps when it changes by at most ``gain`` times its
        input's change and its terms are at most ``size``: None if that exceeds ``tol``
        (the tolerance the input needs is noted for the next pass either way)."""
        slack = rounding_slack(t.dtype, size)
        needed = needed_bound(tol, slack, gain)
        if needed is not None:  # the next pass holds the input within this
            self._needed[rec.name] = needed
        error = gain * (1 + 2 * torch.finfo(t.dtype).eps) * rec.error + slack  # rounded
        return error if error <= tol else None


class BatchNormInputs(_NormInputs):
    """Batch norms' inputs, whose ReLU outputs are derived (:class:`ReluOfBatchNorm`)."""

    def takes(self, module) -> bool:
        return isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.training

    def statistics(self, t: torch.Tensor, module) -> bool:
        return t.dim() == 1  # the batch mean and invstd, one per channel

    def derive(self, t, tol: float, stats: ActivationStats, name: str, debug: bool):
        """A :class:`ReluOfBatchNorm` record for ``t`` if it is ReLU's output of a batch
        norm (training mode) whose input is held tightly enough for ``tol``; else None."""
        fn = t.grad_fn
        if type(fn).__name__ != RELU_NODE or t.dtype not in _EXACT:
            return None
        norm, nr = fn.next_functions[0]
        if type(norm).__name__ != BATCH_NORM_NODE or nr != 0 or not norm._saved_training:
            return None
        source = self._source(norm, t)
        if source is None or source[0].shape != tuple(t.shape):
            return None
        rec, magnitude, module = source
        mean, invstd = norm._saved_result1, norm._saved_result2  # kept exactly (hooks)
        channels = t.shape[1]
        if mean.numel() != channels or invstd.numel() != channels:
            return None
        weight, bias = module.weight, module.bias  # as the forward pass used them
        if not _same(norm._saved_weight, weight):  # a module whose forward is its own
            return None
        alpha = invstd.double() * (1.0 if weight is None else weight.detach().double())
        beta = (0.0 if bias is None else bias.detach().double()) - mean.double() * alpha
        a, b = float(alpha.abs().max()), float(beta.abs().max())
        error = self._error(t, rec, tol, a, magnitude * a + b)
        if error is None:
            return None
        view = (1, channels) + (1,) * (t.dim() - 2)
        alpha, beta = alpha.to(t.dtype).reshape(view), beta.to(t.dtype).reshape(view)
        return ReluOfBatchNorm(t, rec, alpha, beta, tol, error, stats, name, debug)


class LayerNormInputs(_NormInputs):
    """Layer norms' inputs, whose outputs are derived (:class:`LayerNormOfInput`)."""

    def takes(self, module) -> bool:
        return isinstance(module, torch.nn.LayerNorm)

    def statistics(self, t: torch.Tensor, module) -> bool:
        k = len(module.normalized_shape)  # mean and rstd: size 1 in the normalized dims
        return t.dim() >= k and all(n == 1 for n in t.shape[t.dim() - k :])

    def derive(self, t, tol: float, stats: ActivationStats, name: str, debug: bool):
        """A :class:`LayerNormOfInput` record for ``t`` if it is a layer norm's output
        (or a reshape of it) whose input is held tightly enough for ``tol``; else None."""
        made = self._made_by(t, LAYER_NORM_NODE)
        if made is None:
            return None
        fn, rec, magnitude, module = made
        mean, rstd = fn._saved_result1, fn._saved_result2  # kept exactly (hooks)
        weight, bias = module.weight, module.bias  # as the forward pass used them
        if not (_same(fn._saved_weight, weight) and _same(fn._saved_bias, bias)):
            return None
        w = None if weight is None else weight.detach().clone()
        b = None if bias is None else bias.detach().clone()
        gain = float(rstd.max()) * (1.0 if w is None else float(w.abs().max()))
        reach = 0.0 if b is None else float(b.abs().max())
        size = (magnitude + float(mean.abs().max())) * gain + reach
        error = self._error(t, rec, tol, gain, size)
        if error is None:
            return None
        return LayerNormOfInput(t, rec, mean, rstd, w, b, tol, error, stats, name, debug)


def _same(saved, param) -> bool:
    """Whether the tensor an autograd node saved is the module's parameter ``param``."""
    if saved is None or param is None:
        return saved is None and param is None
    return saved.data_ptr() == param.data_ptr() and saved.shape == param.shape


class Derived(Watched, Held):
    """A tensor restored as a function of another record (``source``); holds only what
    that function needs beyond it. ``tolerance``: the bound promised; ``error``: the
    bound it keeps (no larger)."""

    __slots__ = ("source", "shape", "dtype", "tolerance", "error", "watch", "name", "original")
    zeros_exact = False  # whether the function keeps the zeros of the output exact
    mode = "abs"

    def __init__(self, t, source, nbytes: int, tol, error, stats, name, debug):
        super().__init__(nbytes, stats)
        self.source, self.shape, self.dtype = source, tuple(t.shape), t.dtype
        self.tolerance, self.error, self.name = tol, error, name
        self.watch = VersionWatch(t)
        self.original = t.detach().clone() if debug else None

    def restore(self) -> torch.Tensor:
        if self._keep is not None:
            return self._keep
        x = self.source.restore()
        self.source.keep_restored(x)  # the source's own saver, next in backward, takes it
        return self._derive(x)

    def _derive(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def check(self, y: torch.Tensor) -> None:
        """Raise AssertionError where ``y`` breaks the bound (debug mode)."""
        if self.original is not None:
            tol = self.tolerance
            check_restored(self.name, self.original, y, tol, tol, self.zeros_exact)


class GeluOfInput(Derived):
    """GELU of the record of its input."""

    __slots__ = ("approximate",)

    def __init__(self, t, source, approximate, tol, error, stats, name, debug):
        super().__init__(t, source, 0, tol, error, stats, name, debug)
        self.approximate = approximate

    def _derive(self, x: torch.Tensor) -> torch.Tensor:
        # GELU of a very negative input underflows to zero, or nearly: zeros may move
        return F.gelu(x, approximate=self.approximate).reshape(self.shape)


class ReluOfBatchNorm(Derived):
    """ReLU of ``x * alpha + beta`` (per channel) of the record ``x`` of a batch norm's
    input, positive exactly where the output was (a 1-bit mask). On the CPU, numba
    kernels (``kernels.py``) pack the mask and restore the output, one pass each."""

    __slots__ = ("alpha", "beta", "mask")
    zeros_exact = True

    def __init__(self, t, source, alpha, beta, tol, error, stats, name, debug):
        mask = _positive_bits(t.detach())
        nbytes = mask.numel() + 2 * alpha.numel() * alpha.element_size()
        super().__init__(t, source, nbytes, tol, error, stats, name, debug)
        self.alpha, self.beta, self.mask = alpha, beta, mask

    def _derive(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(self.shape)
        inner = math.prod(self.shape[2:])
        if x.device.type == "cpu" and inner > 0 and inner % 8 == 0:  # alpha: x.dtype too
            return _relu_of_affine(x.contiguous(), self.alpha, self.beta, self.mask, inner)
        y = torch.addcmul(self.beta, x, self.alpha)
        y.clamp_min_(torch.finfo(y.dtype).tiny)  # a positive whose norm came back <= 0
        return y.mul_(unpack_bits(self.mask, self.shape).view(torch.uint8))  # zeros: 0


def _positive_bits(t: torch.Tensor) -> torch.Tensor:
    """:func:`pack_bits` of ``t > 0``."""
    if t.device.type != "cpu" or not t.is_contiguous():
        return pack_bits(t > 0)
    out = torch.empty((t.numel() + 7) // 8, dtype=torch.uint8)
    kernels.positive_bits(t.reshape(-1).numpy(), out.numpy())
    return out


def _relu_of_affine(x, alpha, beta, mask, inner: int) -> torch.Tensor:
    """ReLU of ``x * alpha + beta`` (per channel, dim 1), zero where ``mask``'s bit is
    not set, by the CPU kernel on one thread (the pass is memory-bound: a second thread
    does not pay for itself; see benchmarks/activations.py)."""
    out = torch.empty_like(x)
    table = kernels.BIT_FACTORS[x.dtype == torch.float32]
    tiny = table.dtype.type(torch.finfo(x.dtype).tiny)
    kernels.relu_of_affine(
        x.reshape(-1).numpy(),
        alpha.reshape(-1).numpy(),
        beta.reshape(-1).numpy(),
        mask.numpy(),
        inner,
        tiny,
        table,
        out.reshape(-1).numpy(),
    )
    return out


class LayerNormOfInput(Derived):
    """A layer norm of the record ``x`` of its input: ``(x - mean) * rstd * weight +
    bias`` with the statistics the norm saved (kept exactly, held by the norm too)."""

    __slots__ = ("mean", "rstd", "weight", "bias")

    @property
    def tightens(self) -> bool:
        """The norm learns the bound its input needs for a tighter output (one pass
        later), where that input's record is the codec's own (a derived one's bound
        would follow one more pass later, and chains of them need not settle)."""
        return isinstance(self.source, Compressed)

    def __init__(self, t, source, mean, rstd, weight, bias, tol, error, stats, name, debug):
        nbytes = sum(p.numel() * p.element_size() for p in (weight, bias) if p is not None)
        super().__init__(t, source, nbytes, tol, error, stats, name, debug)
        self.mean, self.rstd, self.weight, self.bias = mean, rstd, weight, bias

    def _derive(self, x: torch.Tensor) -> torch.Tensor:
        # written in C order whatever the input's layout (a residual stream laid out
        # token-fastest), as the norm wrote it: no copy to reshape it afterwards
        x = x.reshape(self.source.shape)
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        torch.sub(x, self.mean, out=y).mul_(self.rstd)
        if self.weight is not None and self.bias is not None:
            torch.addcmul(self.bias, y, self.weight, out=y)  # one pass for both
        elif self.weight is not None:
            y.mul_(self.weight)
        elif self.bias is not None:
            y.add_(self.bias)
        return y.reshape(self.shape)
