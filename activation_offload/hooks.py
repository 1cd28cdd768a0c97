"""Compress the tensors autograd saves for backward: ``ActivationCompression`` and ``wrap``.

One ``torch.autograd.graph.saved_tensors_hooks`` pair does all the work (PyTorch
applies only the innermost pair, so everything a saved tensor goes through
happens inside it). Pack: parameters and buffers (also as views or autocast
copies), non-float tensors, tensors under ``min_bytes`` and tensors of excluded
modules are kept as they are; a tensor saved again (same storage, view and
version) reuses its first record; a GELU's output is restored as GELU of its
saved input, a ReLU's output after a batch norm as ReLU of the norm of its saved
input, and a layer norm's output as the norm of its saved input (``derived.py``; the
norms' statistics are kept exactly for it); a view of memory already held, or of a
linear or convolution layer's output whose input is held (attention's query, key and
value), as a view of it rebuilt in backward (``regions.py``); everything else is
compressed. With a ``TieredStore`` the records' bytes (payloads, or the tensors
themselves) move out of device memory until backward, which prefetches them in the
reverse order of the forward pass. Unpack: the version counter is compared as autograd does (an
in-place edit after saving raises), then the tensor is restored on its device.
"""

from __future__ import annotations

import fnmatch
import weakref

import torch

from ..compress.bounds import ErrorBound
from ..compress.tensor import ValueRange
from ..compress.zstd import check_level
from . import module_hooks
from .adaptive import AdaptiveBounds, layer_kind
from .codec import ActivationCodec
from .derived import Derived, input_tolerance
from .device.bounds import device_bound
from .device.bounds import log_probs as _log_probs
from .device.code_offload import graph_hooks, graph_hooks_apply
from .device.code_records import check_device_path, device_codes_apply, keeps_log_probs
from .device.tile_records import BlockCodes, Compactor, check_device_layout, device_record
from .identity import ParameterStorages, SavedTable
from .records import Compressed, Kept, Offloaded, known_range, memory_order
from .rules import ALL_RULES, RULES, Rules
from .settings import Adaptive, Offload, adaptive_ceiling, as_adaptive, as_offload
from .stats import ActivationStats
from .store.tiered import TieredStore

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DEFAULT_REL = 1e-2  # the bound of a bounded codec given none (docs/activations.md)
# a loss's log-probabilities (cross entropy saves them, ``_log_probs``): an error e becomes
# a factor exp(±e) on the probabilities the gradient is made of, so under ``rel`` they get
# the absolute bound ``rel`` (each probability within about ``rel`` of itself), not ``rel``
# of their range (a bound relative to the range moves the probabilities enough to
# cost validation loss), and adaptive bounds give them the ceiling (see
# benchmarks/activations.py); a codec without a bound (``quant``) keeps them exact
TOP = "(top)"  # the outermost module
OUTSIDE = "(outside)"  # saved outside every module (a loss function, say)
# inside a graph torch.compile traces, module hooks only name rows: skip them there
_compiling = getattr(torch.compiler, "is_compiling", None) or torch._dynamo.is_compiling
# pack and unpack run eagerly, also when called from a frame torch.compile runs
# (model.compile()): traced, the records' bookkeeping fails as input mutations
_eager = torch.compiler.disable


class ActivationCompression:
    """Context manager: the forward pass inside it saves compressed activations.

    ``codec``: a registered lossy codec, e.g. ``"block"`` or ``"sz"`` (error-bounded: one
    of ``abs``, ``rel`` (of each tensor's value range) or ``pw_rel``; none: ``rel=1e-2``) or
    ``"quant"`` (low-bit, e.g. ``bits=2``), or None (nothing compressed; tensors are
    kept exactly). Other keywords go to the codec.
    ``adaptive`` (``abs``/``rel`` only): :class:`Adaptive` per-layer bounds from
    gradient statistics (True: its defaults); the rule is in ``adaptive.py``.
    ``rules``: the opt-in :class:`Rules` that restore some outputs from other records
    (GELU, norms, views of held memory); ``Rules(())`` for the core alone.
    ``offload``: :class:`Offload` settings (or a bare :class:`TieredStore`): what is held
    moves out of device memory until backward.
    ``min_bytes``: smaller tensors are kept as they are.
    ``zstd``: payloads in host memory go through zstd at this level (lossless) where it
    saves a third of their bytes (``zstd_stage.py``), or None.
    ``exclude``: module names (glob patterns) or types whose saved tensors are kept.
    ``model``: names the rows of ``stats`` through hooks on its modules (otherwise torch's
    global module hooks find modules on the fly, and torch.compile(model) warns of them).
    ``debug``: check every restored tensor against its bound (keeps a copy).
    ``device_path``: hold tensors as device codes with no host waits (``abs`` and adaptive
    bounds in block codes, ``device/bounds.py``; ``device/code_records.py``): None on CUDA (not
    the CPU), True on every device, False never;
    with a store they are offloaded, without one compiled graphs inline them
    (``device/code_offload.py``); ``device_layout``: the eager hooks' codes, ``"blocks"`` or
    ``"fixed"`` (``device/tile_records.py``).
    ``stats`` counts bytes of the last step.
    """

    def __init__(
        self,
        codec: str | None = "block",
        *,
        abs=None,
        rel=None,
        pw_rel=None,
        adaptive: Adaptive | bool = False,
        rules: Rules = ALL_RULES,
        offload: Offload | TieredStore | None = None,
        min_bytes: int = 1 << 16,
        zstd: int | None = 1,
        exclude=(),
        model: torch.nn.Module | None = None,
        debug: bool = False,
        device_path: bool | None = None,
        device_layout: str = "blocks",
        **codec_params,
    ):
        adaptive = as_adaptive(adaptive)
        if not isinstance(rules, Rules):
            raise TypeError(f"rules takes Rules(...), got {type(rules).__name__}")
        self._configure(
            {
                "codec": codec,
                "abs": abs,
                "rel": rel,
                "pw_rel": pw_rel,
                "adaptive": adaptive is not None,
                "ceiling": None if adaptive is None else adaptive.ceiling,
                "gradient_error": (adaptive or Adaptive()).gradient_error,
                "update_every": (adaptive or Adaptive()).update_every,
                "min_bytes": min_bytes,
                "zstd": zstd,
                "rules": list(rules.enabled),
                "untested": rules.untested,
                "codec_params": codec_params,
                "device_path": device_path,
                "device_layout": device_layout,
            }
        )
        self.exclude = tuple(exclude)
        bad = [e for e in self.exclude if not isinstance(e, (str, type))]
        if bad:
            raise TypeError(f"exclude takes module names (str) or module types, got {bad!r}")
        self.debug = bool(debug)
        offload = as_offload(offload)
        self.store = None if offload is None else offload.resolve()
        self.prefetch = 2 if offload is None else offload.prefetch
        self._order: list = []  # weak references to the offloaded records, in save order
        self._next = 0  # the highest position not prefetched yet
        self._positions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.stats = ActivationStats()
        self.step = 0
        self._params = ParameterStorages()
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._model = None if model is None else weakref.ref(model)
        if model is not None:
            self._name_modules(model)
        self._stack: list = []
        self._table = SavedTable()
        self._active, self._compactor = None, Compactor()  # block codes not compacted yet

    def _use_rules(self, rules: Rules) -> None:
        """Make the per-pass state of the rules to use on this torch."""
        made = {rule.name: rule.make() for rule in rules.active()}
        self._gelu_inputs = made.get("gelu")
        self._norm_inputs = tuple(made[n] for n in ("batch_norm", "layer_norm") if n in made)
        self._regions = made.get("regions")
        # what saved tensors are derived from, in the order they are tried
        self._inputs = tuple(made.values())

    def _configure(self, config: dict) -> None:
        # settings saved before the zstd stage, or the rules, existed
        config = {"zstd": None, "rules": list(RULES), "untested": "warn", **config}
        check_device_path(config.setdefault("device_path", None))
        check_device_layout(config.setdefault("device_layout", "blocks"))
        codec, params = config["codec"], dict(config["codec_params"])
        bounds = {k: config[k] for k in ("abs", "rel", "pw_rel") if config[k] is not None}
        if config["zstd"] is not None:
            check_level(config["zstd"])
        self._codec = None if codec is None else ActivationCodec(codec, params, config["zstd"])
        #: the bound saved tensors are held under (unresolved), or None
        self.bound = None
        if self._codec is not None and self._codec.bounded:
            bounds = bounds or {"rel": DEFAULT_REL}  # none given: the documented default
            config.update(bounds)
            self.bound = ErrorBound.from_kwargs(**bounds)  # refuses what tp.compress refuses
        elif bounds:
            raise ValueError(f"codec {codec!r} takes no error bound (got {sorted(bounds)})")
        if config["adaptive"]:
            config = adaptive_ceiling(config, bounds)
        if not (isinstance(config["min_bytes"], int) and config["min_bytes"] >= 0):
            raise ValueError(
                f"min_bytes must be a non-negative integer, got {config['min_bytes']!r}"
            )
        self._use_rules(Rules(tuple(config["rules"]), config["untested"]))
        self.config = config
        self._graph_hooks = None  # made for this config when first used
        self.bounds = (
            AdaptiveBounds(config["gradient_error"], config["update_every"])
            if config["adaptive"]
            else None
        )

    # -- the context -------------------------------------------------------------------

    def __enter__(self) -> ActivationCompression:
        if self._active is not None:
            raise RuntimeError("this ActivationCompression is already active (it does not nest)")
        self.stats.reset()
        self._table.clear()
        for inputs in self._inputs:
            inputs.clear()
        self._stack.clear()
        self._order.clear()
        self._params.refresh()
        if self._codec is not None:  # stochastic noise keyed on (seed, step, index)
            self._codec.start_step(self.step)
        pair = (_eager(self._pack), _eager(self._unpack))
        if graph_hooks_apply(self.config, self.bound, self.store is not None, self._model):
            # the same objects each step: compiled graphs are guarded on the hooks' identity
            self._graph_hooks = self._graph_hooks or graph_hooks(*pair, self.config, self.bound)
            pair = self._graph_hooks
        hooks = torch.autograd.graph.saved_tensors_hooks(*pair)
        hooks.__enter__()
        self._active = (hooks, self._module_hooks(pair is not self._graph_hooks))
        return self

    def _module_hooks(self, eager_root: bool) -> list:
        """Register the hooks that name the running module: on the given model's modules,
        or, with no model, on every module (found on the fly); ``eager_root``: the root's
        pair runs eagerly (not with graph hooks: they would break a compiled graph)."""
        model = None if self._model is None else self._model()
        if model is None:  # one global pair for all steps: torch.compile guards on it
            return [module_hooks.activate(self)]
        # the root's pair runs eagerly around a compiled model, so what its graph saves
        # is counted under its row; no global hooks, so torch.compile(model) does not warn
        handles = []
        for m in model.modules():
            wrap = _eager if m is model and eager_root else (lambda hook: hook)
            handles.append(m.register_forward_pre_hook(wrap(self._enter_module)))
            handles.append(m.register_forward_hook(wrap(self._leave_module)))
        return handles

    def __exit__(self, *exc) -> None:
        hooks, handles = self._active
        self._active = None
        for handle in handles:
            handle.remove()
        hooks.__exit__(*exc)
        self._table.clear()
        for inputs in self._inputs:
            inputs.clear()
        self._stack.clear()
        self.step += 1
        self._next = len(self._order) - 1
        self._prefetch_before(len(self._order))  # backward starts with the last saved

    # -- which module is running -------------------------------------------------------

    def _name_modules(self, root: torch.nn.Module) -> None:
        for name, m in root.named_modules():
            self._names.setdefault(m, name or TOP)
            self._params.add_module(m)

    def _enter_module(self, module, args) -> None:
        if _compiling():
            return
        if module not in self._names:
            if not self._stack:
                self._name_modules(module)
            else:
                self._names[module] = f"{self._stack[-1][1]}.{type(module).__name__}"
        self._params.add_module(module)
        name = self._names[module]
        excluded = (bool(self._stack) and self._stack[-1][2]) or self._excluded(name, module)
        self._stack.append((module, name, excluded))

    def _leave_module(self, module, args, output) -> None:
        if _compiling():
            return
        while self._stack:
            m, name, excluded = self._stack.pop()
            if m is module:
                break
        else:
            return
        if self.bounds is not None and self.bounds.observing(self.step):
            self.bounds.observe(name, module, output)
        if self._regions is not None and self._abs_bounds() and not excluded:
            self._regions.add_layer(module, args, output, self._table)

    def _abs_bounds(self) -> bool:
        """Whether saved tensors get absolute bounds (``abs`` or ``rel``)."""
        return self.bound is not None and self.bound.mode != "pw_rel"

    def _excluded(self, name: str, module) -> bool:
        return any(
            (isinstance(e, str) and fnmatch.fnmatchcase(name, e))
            or (isinstance(e, type) and isinstance(module, e))
            for e in self.exclude
        )

    # -- pack / unpack -----------------------------------------------------------------

    def _pack(self, t: torch.Tensor):
        strided = t.layout == torch.strided  # sparse and other layouts: kept, no identity
        if strided and t in self._params:
            return Kept(t, 0, None)
        if self._stack:
            module, name, excluded = self._stack[-1]
        else:
            module, name, excluded = None, OUTSIDE, self._excluded(OUTSIDE, None)
        nbytes = t.numel() * t.element_size()
        if not strided:
            self.stats.count(name, nbytes, nbytes)
            return Kept(t, nbytes, self.stats)
        rec = self._table.find(t)
        if rec is None:
            rec = self._record(t, module, name, nbytes, excluded)
            self._table.add(t, rec)
            stored = rec.nbytes
        else:  # saved again: held once, under the tighter of the two bounds
            stored = 0
            if isinstance(rec, BlockCodes):  # a learned tolerance: the tighter one on the device
                stored = rec.tighten(t, device_bound(self, t, module, name), self._compactor)
            elif isinstance(rec, Compressed) and rec.mode == "abs":  # the same view: its range
                tol = self._tolerance(t, module, name, rec.span)
                if tol < rec.tolerance:
                    stored = rec.tighten(t, tol)
            elif isinstance(rec, Derived):  # also a view of a region
                tol = self._tolerance(t, module, name, rec.span)
                if tol < rec.error:  # its derivation is not close enough: hold it too
                    rec = self._record(t, module, name, nbytes, excluded)
                    self._table.add(t, rec)
                    stored = rec.nbytes
                rec.tolerance = min(rec.tolerance, tol)
        self.stats.count(name, nbytes, stored, rec.tolerance)
        rec.packs += 1
        return rec

    def _record(self, t: torch.Tensor, module, name: str, nbytes: int, excluded: bool):
        norm_inputs = next((n for n in self._norm_inputs if n.takes(module)), None)
        if norm_inputs is not None and norm_inputs.statistics(t, module):
            return Kept(t, nbytes, self.stats)  # a derived output needs them exactly
        on_device = device_codes_apply(self.config, self.bound, t)
        keep = (  # a loss's log-probabilities get an absolute bound: rel-only codes keep them
            self._codec is None
            or t.dtype not in _FLOATS
            or nbytes < self.config["min_bytes"]
            or excluded
            or (not self._codec.bounded and _log_probs(t))
            or (on_device and _log_probs(t) and keeps_log_probs(self.config))
        )
        store = None
        if self.store is not None and nbytes >= self.config["min_bytes"] and not excluded:
            store = self.store
        if not keep and on_device:
            rec = device_record(self, t, name, store, module)
            return self._ordered(rec) if rec.store is not None else rec
        if keep:
            if store is None:
                return Kept(t, nbytes, self.stats)
            return self._ordered(Offloaded(t, nbytes, self.stats, store))
        gelu_input = None  # for an nn.GELU's input: its output's largest magnitude
        rec = span = None
        if not self._codec.bounded:
            mode, tol = None, None
        elif self.bound.mode == "pw_rel":
            mode, tol = "pw_rel", self.bound.value
        else:
            mode, guess = "abs", None  # GELU's output: tried with no pass over it first
            if self._gelu_inputs is not None and self.bound.mode == "rel" and norm_inputs is None:
                guess = self._gelu_inputs.output_span(t)
            if guess is not None:
                tol = self._tolerance(t, module, name, guess)
                rec = self._gelu_inputs.derive(t, tol, self.stats, name, self.debug)
        if mode == "abs" and rec is None:
            # t's range in one pass (memory order), or that of a record of the same elements
            span = self._regions and self._regions.known_range(t) or ValueRange(memory_order(t))
            tol = self._tolerance(t, module, name, span)
            if self._gelu_inputs is not None and isinstance(module, torch.nn.GELU):
                tol, gelu_input = input_tolerance(t, tol, self.bound, span)
            elif norm_inputs is not None:
                tol = norm_inputs.tolerance(name, tol)
            rec = self._derived(t, tol, name)
        if rec is None:
            rec = Compressed(t, self._codec, mode, tol, self.stats, name, self.debug, store, span)
            if mode == "abs" and self._regions is not None:
                self._regions.add_held(t, rec)
        rec.span = known_range(span)  # the ends, not the tensor: t is freed after forward
        if gelu_input is not None:
            self._gelu_inputs.add(t, rec, gelu_input)
        elif norm_inputs is not None and mode == "abs":
            norm_inputs.add(t, rec, module, span)
        return self._ordered(rec) if rec.store is not None else rec

    def _derived(self, t: torch.Tensor, tol: float, name: str):
        """A record restoring ``t`` from what is held already, within ``tol``, or None."""
        for inputs in self._inputs:
            rec = inputs.derive(t, tol, self.stats, name, self.debug)
            if rec is not None:
                return rec
        return None

    def _ordered(self, rec):
        """Note an offloaded record's place in the save order (for prefetching)."""
        self._order.append(weakref.ref(rec))
        self._positions[rec] = len(self._order) - 1
        return rec

    def _prefetch_before(self, position: int) -> None:
        """Prefetch the ``prefetch`` offloaded records saved just before ``position``;
        each record at most once a step, in falling position (backward's order)."""
        self._next = min(self._next, position - 1)
        while self._next >= max(position - self.prefetch, 0):
            rec = self._order[self._next]()
            self._next -= 1
            if rec is not None:
                try:
                    rec.prefetch()
                except KeyError:  # already deleted
                    pass

    def _tolerance(self, t: torch.Tensor, module, name: str, span=None) -> float:
        """The absolute tolerance for a tensor saved by ``module`` (called ``name``);
        ``span``: its :class:`ValueRange`, if one is at hand."""
        bound, ceiling = self.bound, self.config["ceiling"]
        if bound.mode == "rel" and _log_probs(t):
            return bound.value if self.bounds is None else float(ceiling)
        lo, hi = (span or ValueRange(t)).finite if bound.mode == "rel" else (0.0, 0.0)
        tol = bound.resolve_range(lo, hi).tolerance
        if self.bounds is not None:  # the ceiling is a bound of the same mode
            scale = hi - lo if bound.mode == "rel" else 1.0
            tol = self.bounds.tolerance(name, layer_kind(module), tol, ceiling * scale)
        if self._regions is None:
            return tol
        return self._regions.tolerance(name, t, tol)  # as views derived from it need

    def _unpack(self, rec):
        now = rec.current_version()
        if now != rec.version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: it is at version {now}; expected version {rec.version} "
                "instead (checked by tensorpress activation compression, as autograd does)"
            )
        position = self._positions.get(rec) if rec.store is not None else None
        if position is not None:
            self._prefetch_before(position)
        self._compactor.run(self._positions, self._next - max(self.prefetch, 1))
        y = rec.unpacked(rec.restore())
        if self.debug and hasattr(rec, "check"):  # the records with a bound to check
            rec.check(y)
        return y

    # -- state -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Settings, step and adaptive bounds: what a resumed run needs."""
        return {
            "config": dict(self.config, codec_params=dict(self.config["codec_params"])),
            "step": self.step,
            "bounds": None if self.bounds is None else self.bounds.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self._configure(state["config"])
        self.step = int(state["step"])
        if self.bounds is not None and state["bounds"] is not None:
            self.bounds.load_state_dict(state["bounds"])


def offload_activations(
    store: TieredStore, *, prefetch: int = 2, **kwargs
) -> ActivationCompression:
    """Context manager: the forward pass inside it moves its saved activations, exactly,
    into ``store``, prefetching ``prefetch`` records ahead in backward (other keywords
    as :class:`ActivationCompression`)."""
    return ActivationCompression(None, offload=Offload(store, prefetch), **kwargs)


class CompressedActivations(torch.nn.Module):
    """``module`` whose forward runs under an :class:`ActivationCompression` (``.ac``);
    its settings and adaptive bounds travel in ``state_dict``."""

    def __init__(self, module: torch.nn.Module, ac: ActivationCompression):
        super().__init__()
        self.module = module
        self.ac = ac

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            return self.module(*args, **kwargs)  # nothing is saved
        with self.ac:
            return self.module(*args, **kwargs)

    def get_extra_state(self) -> dict:
        return self.ac.state_dict()

    def set_extra_state(self, state: dict) -> None:
        self.ac.load_state_dict(state)


def wrap(model: torch.nn.Module, codec: str | None = "block", **kwargs) -> CompressedActivations:
    """``model`` with its saved activations compressed; keywords as
    :class:`ActivationCompression`."""
    return CompressedActivations(model, ActivationCompression(codec, model=model, **kwargs))
