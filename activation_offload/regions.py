"""Saved tensors held as views of a region of memory that backward can rebuild.

Autograd often saves several views of one storage: attention's query, key and value
(slices of one linear layer's output), attention's output and the same memory
flattened as the next linear layer's input, a linear layer's output as the input of
a GELU. Each would otherwise cost a codec pass of its own. A region is a span of a
storage, ``[offset, offset + numel)`` elements, that can be rebuilt in backward:

- ``HeldRegion``: a dense tensor already held (a codec record): rebuilt by restoring
  it and laying it out as it lay in memory. A view of it costs nothing and keeps the
  record's bound exactly.
- ``LayerRegion``: the output of an ``nn.Linear`` or ``nn.Conv1d/2d/3d`` whose input
  is held, where an output element sums at most ``MAX_TERMS`` products: rebuilt as
  the layer of the restored input, with a copy of the bias and the weight as the
  forward pass used it: the layer's own where the layer saved it (an in-place edit
  then raises, as autograd raises), else a copy. An input within ``e`` gives outputs
  within ``e`` times the largest sum of |weight| over an output's products, plus the
  rounding of computing it twice (:func:`_product_eps`). Where that misses a view's
  own bound, the input's saver is asked for a tighter bound on the next pass
  (``Regions.needs``), so the view is derived from then on.

A loss's log-probabilities, the log-softmax of a layer's whole output (a language
model's logits), are rebuilt as the log-softmax of the rebuilt output
(``LogSoftmaxOfRegion``): within twice the output's bound, as the log-sum-exp moves no
more than its inputs.

A view is rebuilt once per region: the region keeps its rebuilt memory until every
view of it has taken it.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef

from .derived import RESHAPES, Derived, needed_bound, rounding_slack
from .identity import VersionWatch
from .stats import ActivationStats

_EXACT = (torch.float32, torch.float64)
#: a loss's log-probabilities: rebuilt from a layer's rebuilt output
LOG_SOFTMAX_NODE = "LogSoftmaxBackward0"
_FORWARDS = {
    cls: cls.forward for cls in (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
}
#: a layer's output is rebuilt only where an element sums at most this many products
#: (a linear layer's inputs, a convolution's channels times its kernel): a rebuild costs
#: that many multiply-adds an element, and past about this many it costs as much as
#: coding and restoring the output (see benchmarks/activations.py)
MAX_TERMS = 128
#: a view asks its source for a bound at most 2 ** (4 n / m) times tighter (n, m: the
#: view's and the source's sizes): 4 bits a value of the view, about what holding the
#: view itself would cost, spread over the source's values
VIEW_BITS = 4.0


def _product_eps(dtype: torch.dtype, device: torch.device, conv: bool) -> float:
    """The relative rounding of one product-and-add of a layer in ``dtype`` on ``device``.

    float32 products may run in lower precision: bfloat16's (2**-7) under the float32
    matmul precision "medium" or oneDNN's bfloat16 convolutions, TF32's (2**-10) under
    "high", cuBLAS's and cuDNN's TF32 switches or oneDNN's TF32 convolutions."""
    if dtype != torch.float32:
        return torch.finfo(dtype).eps
    precision = torch.get_float32_matmul_precision()
    fp32 = "none"
    if device.type == "cuda":
        tf32 = torch.backends.cudnn.allow_tf32 if conv else torch.backends.cuda.matmul.allow_tf32
        fp32 = "tf32" if tf32 else fp32
    elif conv:
        fp32 = getattr(getattr(torch.backends.mkldnn, "conv", None), "fp32_precision", fp32)
    if precision == "medium" or fp32 == "bf16":
        return torch.finfo(torch.bfloat16).eps
    if precision == "high" or fp32 == "tf32":
        return 2.0**-10
    return torch.finfo(torch.float32).eps


def need_key(name: str, t: torch.Tensor) -> tuple:
    """Which saved tensor of the next pass a tolerance asked for this one applies to: the
    same saver, shape and autograd node type."""
    return name, tuple(t.shape), type(t.grad_fn).__name__


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t`` covers its span of memory exactly once (any order of dims)."""
    expected = 1
    for stride, size in sorted(zip(t.stride(), t.shape, strict=True)):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _span(t: torch.Tensor) -> tuple[int, int]:
    """(first, last + 1) element offsets ``t`` reads in its storage (numel > 0)."""
    first = t.storage_offset()
    return first, first + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))


class Region:
    """A span of a storage that backward rebuilds; ``error``: the bound its elements
    keep; ``source``: the record it is rebuilt from (``saved``: the tensor it holds),
    whose tolerance (``asks``) is tightened when that is not enough."""

    def __init__(self, t: torch.Tensor, offset: int, numel: int, source, saved: torch.Tensor):
        self.storage = StorageWeakRef(t.untyped_storage())
        self.offset, self.numel, self.dtype = offset, numel, t.dtype
        self.version = t._version
        self.source, self.asks = source, need_key(source.name, saved)
        self.views = 0  # views not yet restored
        self.nbytes = 0  # bytes it holds of its own, counted with its first view
        self._memory: torch.Tensor | None = None

    def holds(self, t: torch.Tensor) -> bool:
        """Whether the elements of ``t`` lie in this region, unchanged since."""
        if t.dtype != self.dtype or t._version != self.version or self.storage.expired():
            return False
        first, end = _span(t)
        return self.offset <= first and end <= self.offset + self.numel

    def _source_values(self) -> torch.Tensor:
        """The source restored, kept for its own saver (if still to come in backward)."""
        x = self.source.restore()
        self.source.keep_restored(x)
        return x

    def take(self, stats: ActivationStats | None = None) -> torch.Tensor:
        """The region's elements, flat in memory order (rebuilt once for all views, and
        counted in ``stats.rebuilt``)."""
        memory = self._memory
        if memory is None:
            memory = self._rebuild().reshape(-1)
            if stats is not None:
                stats.rebuilt += 1
        self.views -= 1
        self._memory = memory if self.views > 0 else None
        return memory

    def _rebuild(self) -> torch.Tensor:
        raise NotImplementedError

    def wanted(self, tol: float) -> float | None:
        """The bound the source needs for this region to keep ``tol`` (None: none can)."""
        return tol


class HeldRegion(Region):
    """The memory of a dense tensor held by a codec record."""

    def __init__(self, t: torch.Tensor, rec):
        super().__init__(t, t.storage_offset(), t.numel(), rec, t)
        self.error = rec.error  # (the source, rec, stays alive while a view needs it)
        self.shape, self.stride = tuple(t.shape), tuple(t.stride())

    def _rebuild(self) -> torch.Tensor:
        x = self._source_values()
        if tuple(x.shape) == self.shape and tuple(x.stride()) == self.stride:
            # restored as it lay (the views read it as autograd's saved views read the
            # original): no copy, which costs as much as the restore of a large tensor
            return x.as_strided((self.numel,), (1,), x.storage_offset())
        memory = torch.empty_strided(self.shape, self.stride, dtype=x.dtype, device=x.device)
        memory.copy_(x.reshape(self.shape))
        return memory.as_strided((self.numel,), (1,), memory.storage_offset())


class LayerRegion(Region):
    """The output of a linear or convolution layer, as the layer of its input's record.

    ``weight``: the layer's own (it saved it, so an in-place edit raises as autograd
    does) or a copy; ``bias``: a copy (no layer saves it). The bounds (``error``,
    ``gain``, ``slack``, ``size``) are worked out when a view first asks for them: most
    layers' outputs are never viewed, and the weight's sum costs a pass over it."""

    def __init__(self, output, source, saved, module, weight, bias, rounding):
        super().__init__(output, output.storage_offset(), output.numel(), source, saved)
        # rounding: (input's bound, |input| bound, the rounding of one product, products)
        self.module, self.weight, self.version_of_weight = module, weight, weight._version
        self.bias, self._rounding = bias, rounding
        self.watch = VersionWatch(output)  # (the output may be gone; its views not)

    @functools.cached_property
    def _bounds(self) -> tuple[float, float, float, float]:
        """(error, gain, slack, size): the output's bound, the largest sum of |weight|
        over an output's products, the rounding of computing it twice, and a bound on
        |output|; no bound (infinities) if the weight changed since forward."""
        if self.weight._version != self.version_of_weight:
            return math.inf, math.inf, math.inf, math.inf
        error, magnitude, eps, terms = self._rounding
        with torch.no_grad():
            gain = float(self.weight.detach().double().flatten(1).abs().sum(1).max())
            reach = 0.0 if self.bias is None else float(self.bias.abs().max())
        if not math.isfinite(gain):
            return math.inf, math.inf, math.inf, math.inf
        slack = 2.0 * (terms + 1) * eps * (magnitude * gain + reach)
        error = gain * (1 + 2 * torch.finfo(self.dtype).eps) * error + slack
        return error, gain, slack, magnitude * gain + reach + error

    @property
    def error(self) -> float:
        return self._bounds[0]

    @property
    def size(self) -> float:
        return self._bounds[3]

    def _rebuild(self) -> torch.Tensor:
        if self.weight._version != self.version_of_weight:
            raise RuntimeError(
                f"a {type(self.module).__name__} layer's weight was modified by an inplace "
                "operation between forward and backward, and an activation saved after it "
                "is rebuilt from it (checked by tensorpress activation compression; autograd "
                "raises at that layer's backward)"
            )
        x = self._source_values()
        with torch.no_grad():
            if isinstance(self.module, torch.nn.Linear):
                y = F.linear(x.reshape(-1, self.weight.shape[1]), self.weight, self.bias)
            else:
                y = self.module._conv_forward(x.reshape(self.source.shape), self.weight, self.bias)
            return y.contiguous()

    def wanted(self, tol: float) -> float | None:
        _, gain, slack, _ = self._bounds
        return needed_bound(tol, slack, gain)


class Regions:
    """The regions of one forward pass, by storage, and the tighter tolerances their
    views asked of the records they are rebuilt from (``needs``: from the last pass)."""

    def __init__(self):
        self._by_storage: dict = {}  # storage cdata -> [Region]
        self._by_node: dict = {}  # autograd node of a layer's output -> its LayerRegion
        self.needs: dict = {}  # need_key -> tolerance, from the last pass
        self._asked: dict = {}  # the same, this pass

    def clear(self) -> None:
        """Forget this pass's regions; what its views asked is used from now on."""
        self._by_storage.clear()
        self._by_node.clear()
        if self._asked:
            self.needs, self._asked = self._asked, {}

    def tolerance(self, name: str, t: torch.Tensor, tol: float) -> float:
        """The tolerance for ``t``, saved by ``name`` (its own: ``tol``)."""
        if not self.needs:
            return tol
        return min(tol, self.needs.get(need_key(name, t), math.inf))

    def _add(self, region: Region) -> None:
        self._by_storage.setdefault(region.storage.cdata, []).append(region)

    def add_held(self, t: torch.Tensor, rec) -> None:
        """Note ``rec``, held for ``t``, as a region if ``t`` is dense and float32/64."""
        if t.dtype in _EXACT and t.numel() > 0 and _dense(t):
            self._add(HeldRegion(t, rec))

    def known_range(self, t: torch.Tensor):
        """The range a held record took of exactly ``t``'s elements (``t`` a dense view
        covering all of its memory, such as attention's probabilities reshaped for a
        batched product), or None: the same values, no second pass over them."""
        if t.dtype not in _EXACT or t.numel() == 0:
            return None
        for region in self._by_storage.get(StorageWeakRef(t.untyped_storage()).cdata, ()):
            if isinstance(region, HeldRegion) and region.numel == t.numel() and region.holds(t):
                return region.source.span if _dense(t) else None
        return None

    def add_layer(self, module, args, output, table) -> None:
        """Note the output of ``module`` (an ``nn.Linear`` or ``nn.Conv1d/2d/3d``) as a
        region if its input is held under an absolute bound (``table``: the records of
        this pass) and rebuilding it costs at most ``MAX_TERMS`` products an element."""
        if not (args and isinstance(args[0], torch.Tensor) and isinstance(output, torch.Tensor)):
            return
        if type(module).forward is not _FORWARDS.get(type(module)):  # a layer of its own
            return
        x, weight, bias = args[0], module.weight, module.bias
        if output.dtype not in _EXACT or x.dtype != output.dtype or weight.dtype != x.dtype:
            return
        terms = weight[0].numel()  # products summed for an output element
        if x.numel() == 0 or terms > MAX_TERMS or not output.requires_grad:
            return
        if not output.is_contiguous():  # laid out as the rebuilt output will be
            return
        linear = isinstance(module, torch.nn.Linear)
        if linear and (x.dim() < 2 or output.shape[:-1] != x.shape[:-1]):
            return
        saved = x
        rec = table.find(x)
        if rec is None and linear and x.is_contiguous():
            saved = x.view(-1, x.shape[-1])  # as the layer saved it
            rec = table.find(saved)
        error = getattr(rec, "error", None)
        if error is None or not math.isfinite(error) or not rec.tightens:
            return  # (a record whose bound does not follow what views need)
        if x.requires_grad:  # the layer saved its weight: autograd sees it edited
            held = 0
        elif weight.numel() * 16 <= output.numel():  # the layer saved none: a copy
            weight = weight.detach().clone()
            held = weight.numel() * weight.element_size()
        else:
            return
        span = getattr(rec, "span", None)  # the values of x, where its record took them
        with torch.no_grad():
            lo, hi = torch.aminmax(x) if span is None else span.ends
        magnitude = max(-float(lo), float(hi)) + error
        if not math.isfinite(magnitude):
            return
        eps = _product_eps(x.dtype, x.device, conv=not linear)  # the settings of forward
        bias = None if bias is None else bias.detach().clone()
        rounding = (error, magnitude, eps, terms)
        region = LayerRegion(output, rec, saved, module, weight, bias, rounding)
        region.nbytes = held + (0 if bias is None else bias.numel() * bias.element_size())
        self._add(region)
        if output.grad_fn is not None:
            self._by_node[output.grad_fn] = region

    def derive(self, t, tol: float, stats: ActivationStats, name: str, debug: bool):
        """A :class:`ViewOfRegion` record for ``t`` if a region of this pass holds its
        elements within ``tol``; else None."""
        if t.dtype not in _EXACT or t.numel() == 0:
            return None
        if type(t.grad_fn).__name__ == LOG_SOFTMAX_NODE:
            return self._log_softmax(t, tol, stats, name, debug)
        regions = self._by_storage.get(StorageWeakRef(t.untyped_storage()).cdata, ())
        holding = [r for r in regions if r.holds(t)]
        for region in holding:
            if region.error <= tol:
                self._ask(region, t, tol)
                return ViewOfRegion(t, region, tol, stats, name, debug)
        if holding:
            self._ask(holding[0], t, tol)
        return None

    def _log_softmax(self, t, tol: float, stats, name: str, debug: bool):
        """A :class:`LogSoftmaxOfRegion` record for the log-softmax ``t`` of a layer's
        whole output (or a reshape of it), unchanged since, if that keeps ``tol``."""
        fn = t.grad_fn.next_functions[0][0]
        while fn not in self._by_node and type(fn).__name__ in RESHAPES:
            fn = fn.next_functions[0][0]
        region = self._by_node.get(fn)
        if region is None or region.numel != t.numel() or region.dtype != t.dtype:
            return None
        if region.watch.current != region.version:  # edited in place since
            return None
        lo, hi = torch.aminmax(t.detach())
        slack = rounding_slack(t.dtype, 2 * region.size + max(-float(lo), float(hi)))
        within = (tol - slack) / 2  # the log-sum-exp moves no more than its inputs
        if not within > 0:
            return None
        self._ask(region, t, within)
        if region.error > within:
            return None
        error = 2 * region.error + slack
        return LogSoftmaxOfRegion(t, region, t.grad_fn._saved_dim, tol, error, stats, name, debug)

    def _ask(self, region: Region, t: torch.Tensor, tol: float) -> None:
        """Note the tolerance ``region``'s source needs for ``t`` to be derived within
        ``tol``, where that pays: the source honours it, and its bound shrinks by at
        most ``VIEW_BITS`` bits a value of ``t``."""
        source = region.source
        if not source.tightens:
            return
        wanted = region.wanted(tol)
        bits = min(VIEW_BITS * t.numel() / math.prod(source.shape), 24.0)
        if wanted is not None and wanted * 2.0**bits >= source.tolerance:
            self._asked[region.asks] = min(self._asked.get(region.asks, math.inf), wanted)


class ViewOfRegion(Derived):
    """A saved tensor restored as a view of a rebuilt region: no bytes of its own."""

    __slots__ = ("stride", "offset")

    def __init__(self, t, region: Region, tol, stats, name, debug):
        super().__init__(t, region, region.nbytes, tol, region.error, stats, name, debug)
        region.nbytes = 0
        self.stride, self.offset = tuple(t.stride()), t.storage_offset() - region.offset
        region.views += 1

    def restore(self) -> torch.Tensor:
        if self._keep is not None:
            return self._keep
        memory = self.source.take(self._stats)
        return memory.as_strided(self.shape, self.stride, memory.storage_offset() + self.offset)


class LogSoftmaxOfRegion(Derived):
    """The log-softmax of a layer's rebuilt output (a loss's log-probabilities): within
    twice the output's bound, as the log-sum-exp moves no more than its inputs."""

    __slots__ = ("dim",)

    def __init__(self, t, region: Region, dim: int, tol, error, stats, name, debug):
        super().__init__(t, region, region.nbytes, tol, error, stats, name, debug)
        region.nbytes = 0
        self.dim = dim
        region.views += 1

    def restore(self) -> torch.Tensor:
        if self._keep is not None:
            return self._keep
        return torch.log_softmax(self.source.take(self._stats).view(self.shape), self.dim)
