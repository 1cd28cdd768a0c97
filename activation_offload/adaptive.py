"""Per-layer error bounds set from the gradients they feed (after COMET and AC-GC).

A layer with weight W (``K = W[0].numel()`` inputs per output) saves its input x;
backward forms the weight gradient ``G = sum_n g_y[n]^T x[n]`` from it and the
output gradient g_y. If the restored x carries independent errors of variance s^2
(a uniform error within ±e has s^2 = e^2 / 3), G gains an error with

    E ||dG||^2 = s^2 * K * ||g_y||^2

so keeping that below ``gradient_error`` times ``||G||^2`` allows

    e = sqrt(3 * gradient_error * ||G||^2 / (K * ||g_y||^2)).

Every ``update_every`` steps the controller measures ||g_y||^2 (a hook on the
layer's output) and ||G||^2 (a hook after the weight's gradient is accumulated)
and re-derives e for each such layer, held between the user's bound and the
ceiling. Every other saved tensor keeps the user's bound: the rule says nothing
about them, and loosening them (activation functions' and attention's tensors at
the ceiling) cost accuracy and gradient error in benchmarks/activations.py. A tensor
saved by a weighted layer and by another op (a ReLU output is also the next
convolution's input) is held once, under the tighter bound.

The statistics stay on the gradients' device: ||g_y||^2 accumulates as a device scalar,
and e is computed there (a float64 device scalar, NaN until a finite e has been
learned), so an update step reads nothing back to the host; the device path passes e to
its kernels as it is (``learned``). The host reads it where a host float is asked for:
the host path's ``tolerance``, ``tolerances`` and ``state_dict``. A resumed run's
tolerances (``load_state_dict``) are host values: they move to the device together, in
one copy (from pinned memory on CUDA, not waited for), when a step first asks for one
there, so no step copies a scalar per tensor or waits on the host.

The default ``gradient_error`` is 1e-3, not the 1e-2 the derivation alone would
suggest: rounding errors are not independent where inputs repeat (tokens that
attention has made alike round the same way), so a layer's real gradient error can
be several times what its rule allowed (benchmarks/activations.py, the attention
model).
"""

from __future__ import annotations

import math

import torch


def layer_kind(module) -> str:
    """'weighted' when a weight of 2 or more dims consumes the saved input (linear,
    convolution), else 'other' (normalization, activation functions, attention,
    pooling, containers, no module)."""
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.nn.Parameter) and weight.dim() >= 2:
        return "weighted"
    return "other"


class AdaptiveBounds:
    """Per-module absolute tolerances derived from gradient statistics (see the module
    docstring); ``state_dict`` holds everything a resumed run needs."""

    def __init__(self, gradient_error: float = 1e-3, update_every: int = 50):
        if not (isinstance(gradient_error, (int, float)) and 0 < gradient_error < 1):
            raise ValueError(f"gradient_error must be in (0, 1), got {gradient_error!r}")
        if not (isinstance(update_every, int) and update_every >= 1):
            raise ValueError(f"update_every must be a positive integer, got {update_every!r}")
        self.gradient_error = float(gradient_error)
        self.update_every = update_every
        self._learned: dict[str, torch.Tensor] = {}  # float64 [1] each, NaN: none yet
        self._loaded: dict[str, torch.Tensor] | None = None  # loaded, still on the host
        self._grad_out: dict[str, torch.Tensor] = {}
        self._watched: set[str] = set()

    @property
    def tolerances(self) -> dict[str, float]:
        """The learned tolerances, as host floats (one read of each)."""
        host = {name: float(t.cpu()[0]) for name, t in self._learned.items()}
        return {name: tol for name, tol in host.items() if math.isfinite(tol)}

    def observing(self, step: int) -> bool:
        return step % self.update_every == 0

    def tolerance(self, name: str, kind: str, base: float, ceiling: float) -> float:
        """The tolerance of a tensor saved by layer ``name`` of ``kind`` (see
        :func:`layer_kind`), given the user's bound ``base`` and the ``ceiling``: a host
        float (the learned one is read back)."""
        learned = self.learned(name, kind)
        if learned is None:
            return base
        tol = float(learned.cpu()[0])
        return base if math.isnan(tol) else min(max(tol, base), ceiling)

    def learned(self, name: str, kind: str, device=None) -> torch.Tensor | None:
        """The learned tolerance of a tensor saved by layer ``name`` of ``kind``: a float64
        tensor of one element (NaN: the bound), on ``device`` if given, or None where the
        bound applies as it is. Reads nothing back to the host."""
        if kind != "weighted":
            return None
        if device is not None:
            self._move_loaded(torch.device(device))
        tol = self._learned.get(name)
        if tol is not None and device is not None and tol.device != torch.device(device):
            tol = self._learned[name] = tol.to(device)
        return tol

    def _move_loaded(self, device: torch.device) -> None:
        """Move the loaded tolerances that no update has replaced since to ``device``
        (not the CPU, where they are), all in one copy."""
        if self._loaded is None or device.type == "cpu":
            return
        host, self._loaded = self._loaded, None
        block = torch.cat(list(host.values()))
        if device.type == "cuda":  # a copy from pinned memory: queued, not waited for
            block = block.pin_memory()
        moved = block.to(device, non_blocking=True)
        for i, (name, view) in enumerate(host.items()):
            if self._learned.get(name) is view:
                self._learned[name] = moved[i : i + 1]

    def observe(self, name: str, module: torch.nn.Module, output) -> None:
        """Hook one forward call of ``module`` (named ``name``) so that its backward
        updates the module's tolerance."""
        weight = getattr(module, "weight", None)
        if not (
            isinstance(weight, torch.nn.Parameter)
            and weight.dim() >= 2
            and weight.requires_grad
            and isinstance(output, torch.Tensor)
            and output.requires_grad
        ):
            return
        output.register_hook(lambda g: self._add_grad_out(name, g))
        if name in self._watched:  # called twice this step: one weight hook is enough
            return
        self._watched.add(name)
        k = weight[0].numel()
        handle = None

        def on_weight_grad(p: torch.Tensor) -> None:
            handle.remove()
            self._watched.discard(name)
            gy = self._grad_out.pop(name, None)
            if p.grad is None or gy is None:
                return
            gw = _square_sum(p.grad).to(gy.device)
            tol = torch.sqrt(3.0 * self.gradient_error * gw / (k * gy))
            self._move_loaded(tol.device)
            old = self._learned.get(name)
            old = torch.full_like(tol, math.nan) if old is None else old.to(tol.device)
            ok = torch.isfinite(tol) & (gy > 0)  # on the device: no read back
            self._learned[name] = torch.where(ok, tol, old)

        handle = weight.register_post_accumulate_grad_hook(on_weight_grad)

    def _add_grad_out(self, name: str, g: torch.Tensor) -> None:
        gy = _square_sum(g)
        old = self._grad_out.get(name)
        self._grad_out[name] = gy if old is None else old + gy

    def state_dict(self) -> dict:
        return {
            "gradient_error": self.gradient_error,
            "update_every": self.update_every,
            "tolerances": self.tolerances,
        }

    def load_state_dict(self, state: dict) -> None:
        self.__init__(state["gradient_error"], state["update_every"])
        self._learned = {
            str(k): torch.tensor([float(v)], dtype=torch.float64)
            for k, v in state["tolerances"].items()
        }
        self._loaded = dict(self._learned) or None  # moved at first use on a device


def _square_sum(g: torch.Tensor) -> torch.Tensor:
    """||g||^2 as a float64 tensor of one element on ``g``'s device."""
    return g.detach().float().pow(2).sum().double().reshape(1)
