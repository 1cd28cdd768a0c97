"""A GELU output's residual codes as ``torch.library`` custom ops:
``tensorpress::gelu_residual`` packs the output against GELU of the input held in a block
record, ``tensorpress::gelu_residual_restore`` restores it from the restored input (the
arithmetic is ``gelu_torch.py``; why it keeps the output's bound,
``gelu.py``).

On CUDA with ``triton`` installed (the ``gpu`` extra) they run the Triton kernels
(``gelu_triton.py``): two launches each way, the input's record read
inside the packing kernel. Elsewhere, or with ``TENSORPRESS_DEVICE_CODES=torch``, the torch
reference, which writes the same bytes; in eager mode on CUDA the callers run the bodies
without the dispatch (``ops.eager``). The fake implementations give the shapes from
the element count and the bound alone, so the ops run on meta tensors and trace as one
opaque node each under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from . import gelu_torch as reference
from . import ops


@functools.cache
def _triton():
    """The Triton kernels' module, or None where triton is missing or not wanted."""
    if ops._blocks_triton() is None:
        return None
    from . import gelu_triton

    return gelu_triton


def _kernels(device: torch.device, n: int):
    return _triton() if device.type == "cuda" and n > 0 else None


def _check(approximate: str) -> None:
    if approximate not in reference.APPROXIMATIONS:
        raise ValueError(
            f"GELU's approximate is one of {reference.APPROXIMATIONS}, got {approximate!r}"
        )


@torch.library.custom_op("tensorpress::gelu_residual", mutates_args=())
def gelu_residual(
    y: torch.Tensor,
    source: torch.Tensor,
    approximate: str,
    bound: float,
    absolute: bool,
    learned: torch.Tensor | None,
    ceiling: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scalars float64 ``[lo, hi, use]``, the residual's block record uint8 of
    ``record_bytes``, its bytes in use int64[1]) of GELU's output ``y`` under ``rel``
    (``absolute`` False) or ``abs`` ``bound``, with a learned tolerance (float64 [1] or
    None) held between the bound and ``ceiling``; ``source`` is the block record (blocks
    of 256) of GELU's input, of ``y``'s element count and dtype."""
    return pack(y, source, approximate, bound, absolute, learned, ceiling)


def pack(y, source, approximate, bound, absolute, learned, ceiling):
    """The body of ``tensorpress::gelu_residual``."""
    _check(approximate)
    triton = _kernels(y.device, y.numel())
    if triton is not None:
        return triton.pack(y.contiguous(), source, approximate, bound, absolute, learned, ceiling)
    if y.numel() == 0:
        return reference.empty_pack(y, bound, absolute)
    return reference.pack(y, source, approximate, bound, absolute, learned, ceiling)


@gelu_residual.register_fake
def _(y, source, approximate, bound, absolute, learned, ceiling):
    nbytes = reference.record_bytes(y.numel(), bound, absolute)
    scalars = y.new_empty(3, dtype=torch.float64)
    return scalars, y.new_empty(nbytes, dtype=torch.uint8), y.new_empty(1, dtype=torch.int64)


@torch.library.custom_op("tensorpress::gelu_residual_restore", mutates_args=())
def gelu_residual_restore(
    x: torch.Tensor,
    record: torch.Tensor,
    scalars: torch.Tensor,
    approximate: str,
    shape: Sequence[int],
) -> torch.Tensor:
    """GELU's output of ``shape`` (``x``'s dtype) from the restored input ``x`` and the
    residual's record (its slot, or the slot's used prefix) and scalars."""
    return restore(x, record, scalars, approximate, shape)


def restore(x, record, scalars, approximate, shape) -> torch.Tensor:
    """The body of ``tensorpress::gelu_residual_restore``."""
    _check(approximate)
    triton = _kernels(record.device, x.numel())
    if triton is not None:
        x = x.contiguous()
        return triton.restore(x, record, scalars, approximate, tuple(shape), x.dtype)
    return reference.restore(x, record, scalars, approximate, tuple(shape), x.dtype)


@gelu_residual_restore.register_fake
def _(x, record, scalars, approximate, shape) -> torch.Tensor:
    return x.new_empty(tuple(shape))
