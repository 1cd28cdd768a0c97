"""The bound a saved tensor gets on the device path's block codes, with no host read.

The host path's rules (``hooks.py``, ``_tolerance``), held on the device:

- under ``rel``: ``rel`` of the tensor's finite range, on the device;
- under ``abs``: ``abs`` (block codes hold any ``abs`` bound: a block whose steps would
  need the dtype's own bits is stored raw, ``tiles.py``);
- with adaptive bounds, a tensor saved by a weighted layer (linear, convolution): the
  tolerance learned from the gradients (``adaptive.py``), a float64 device scalar that
  the kernel holds between the bound and the ceiling: its value is never read back;
- a loss's log-probabilities under ``rel``: the absolute bound ``rel`` (the ceiling with
  adaptive bounds), as on the host path, held under ``abs``.

A tensor saved twice is held once, under the tighter bound, as on the host path: a record
made under a learned tolerance is made again (``BlockCodes.tighten``) under the bound
alone when another op saves it, or under the smaller of two learned tolerances (a
``torch.minimum`` on the device) when another weighted layer does.
"""

from __future__ import annotations

import torch

from ...compress.bounds import ErrorBound
from ..adaptive import layer_kind
from ..regions import LOG_SOFTMAX_NODE


def log_probs(t: torch.Tensor) -> bool:
    """Whether ``t`` is a loss's log-probabilities (a log-softmax's output)."""
    return type(t.grad_fn).__name__ == LOG_SOFTMAX_NODE


def rel_abs(bound: ErrorBound | None) -> tuple[float | None, float | None]:
    """``(rel, abs)`` of ``bound`` (an ``ActivationCompression``'s, unresolved): the value
    under its own mode, None under the other; both None with no bound or ``pw_rel``
    (which no device encoding holds)."""
    mode, value = (None, None) if bound is None else (bound.mode, bound.value)
    return (value if mode == "rel" else None), (value if mode == "abs" else None)


def device_bound(ac, t: torch.Tensor, module, name: str) -> dict:
    """The keywords of ``compress_blocks`` for ``t``, saved by ``module`` (named ``name``)
    under the settings of ``ActivationCompression`` ``ac``."""
    config, bounds = ac.config, ac.bounds
    rel, abs_ = rel_abs(ac.bound)
    if rel is not None and log_probs(t):
        return {"abs": rel if bounds is None else config["ceiling"]}
    bound = {"rel": rel} if abs_ is None else {"abs": abs_}
    learned = None if bounds is None else bounds.learned(name, layer_kind(module), t.device)
    if learned is not None:
        bound.update(learned=learned, ceiling=config["ceiling"])
    return bound
