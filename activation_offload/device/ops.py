"""The device codes as ``torch.library`` custom ops: ``tensorpress::device_codes`` and
``tensorpress::device_restore`` (the layout is in ``codes.py``), and the block
codes as ``tensorpress::device_blocks`` (``rel``), ``tensorpress::device_blocks_bounded``
(``rel`` or ``abs``, with a learned tolerance) and ``tensorpress::device_blocks_restore``
(``tiles.py``; Triton kernels on CUDA for blocks of 256, as for the fixed codes).

Their fake implementations compute the outputs' shapes from the layout alone, so the
codes run on meta tensors (the CPU's proof that nothing is read back) and trace as one
opaque node each under ``torch.compile(fullgraph=True)``. On CUDA, with ``triton``
installed (the ``gpu`` extra), the ops run the Triton kernels; elsewhere the torch
reference. ``TENSORPRESS_DEVICE_CODES=torch`` picks the reference on CUDA too.

In eager mode on CUDA the callers skip the ops' dispatch (:func:`eager`): boxing the
arguments of a Python custom op through the dispatcher costs tens of microseconds of host
time a call (``benchmarks/tensor_latency.py``, "custom-op dispatch"), as much as the host
time a saved tensor may take in all, and buys nothing there; traced graphs, fake and meta
tensors go through the ops.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence

import torch

from . import codes_torch as reference
from . import tiles_torch as blocks_reference
from .codes_layout import N_SCALARS, STEP_MARGIN, code_bits, payload_bytes, steps


@functools.cache
def _triton():
    """The Triton kernels' module, or None where triton is missing or not wanted."""
    if os.environ.get("TENSORPRESS_DEVICE_CODES", "") == "torch":
        return None
    try:
        from . import codes_triton
    except ImportError:
        return None
    return codes_triton


def _kernels(device: torch.device):
    return _triton() if device.type == "cuda" else None


@functools.cache
def _blocks_triton():
    """The block codes' Triton kernels, or None (as :func:`_triton`)."""
    if _triton() is None:
        return None
    from . import tiles_triton

    return tiles_triton


def _block_kernels(device: torch.device, block: int, n: int):
    """The Triton kernels for ``n`` elements in blocks of ``block`` on ``device``, or None."""
    if device.type != "cuda" or n == 0 or _blocks_triton() is None:
        return None
    return _blocks_triton() if block == _blocks_triton().BLOCK else None


def eager(op, body, *args):
    """``op(*args)``, or its ``body(*args)`` where the dispatch buys nothing: a plain CUDA
    tensor first, outside a trace (fake, meta and functional tensors are subclasses or
    other devices, and compiled graphs need the op's node)."""
    first = args[0]
    if type(first) is torch.Tensor and first.is_cuda and not torch.compiler.is_compiling():
        return body(*args)
    return op(*args)


def codes(x: torch.Tensor, rel: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The body of ``tensorpress::device_codes``."""
    nsteps, bits = steps(rel), code_bits(rel)
    triton = _kernels(x.device)
    if triton is not None and x.numel() > 0:
        return triton.compress(x.contiguous(), rel, nsteps, bits, STEP_MARGIN)
    return reference.compress(x, rel, nsteps, bits, STEP_MARGIN)


@torch.library.custom_op("tensorpress::device_codes", mutates_args=())
def device_codes(x: torch.Tensor, rel: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(payload uint8, scalars float64 ``[lo, hi, step]``) of ``x`` under ``rel``."""
    return codes(x, rel)


@device_codes.register_fake
def _(x: torch.Tensor, rel: float) -> tuple[torch.Tensor, torch.Tensor]:
    nbytes = payload_bytes(x.numel(), code_bits(rel))
    payload = x.new_empty(nbytes, dtype=torch.uint8)
    return payload, x.new_empty(N_SCALARS, dtype=torch.float64)


def restore(payload, scalars, shape, dtype, rel) -> torch.Tensor:
    """The body of ``tensorpress::device_restore``."""
    nsteps, bits = steps(rel), code_bits(rel)
    triton = _kernels(payload.device)
    if triton is not None and math.prod(shape) > 0:
        return triton.restore(payload, scalars, tuple(shape), dtype, nsteps, bits)
    return reference.restore(payload, scalars, tuple(shape), dtype, nsteps, bits)


@torch.library.custom_op("tensorpress::device_restore", mutates_args=())
def device_restore(
    payload: torch.Tensor,
    scalars: torch.Tensor,
    shape: Sequence[int],
    dtype: torch.dtype,
    rel: float,
) -> torch.Tensor:
    """The tensor of ``shape`` and ``dtype`` that ``payload`` and ``scalars`` hold."""
    return restore(payload, scalars, shape, dtype, rel)


@device_restore.register_fake
def _(payload, scalars, shape, dtype, rel) -> torch.Tensor:
    return payload.new_empty(tuple(shape), dtype=dtype)


def _slot(dtype: torch.dtype, bound: float, absolute: bool) -> tuple[int, int]:
    """(steps, slot bits) of block codes of ``dtype`` under the bound."""
    if absolute:
        return blocks_reference.RAW_LIMIT, blocks_reference.slot_bits(dtype, None)
    return steps(bound), blocks_reference.slot_bits(dtype, code_bits(bound))


@torch.library.custom_op("tensorpress::device_blocks", mutates_args=())
def device_blocks(x: torch.Tensor, rel: float, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(record uint8 of the worst case's size, bytes in use int64[1]) of ``x`` under
    ``rel`` in blocks of ``block`` elements (the layout is in ``tiles.py``)."""
    return rel_blocks(x, rel, block)


def rel_blocks(x, rel, block):
    """The body of ``tensorpress::device_blocks``."""
    return blocks(x, rel, block, False, None, 0.0)


@device_blocks.register_fake
def _(x: torch.Tensor, rel: float, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _blocks_fake(x, rel, block, False)


@torch.library.custom_op("tensorpress::device_blocks_bounded", mutates_args=())
def device_blocks_bounded(
    x: torch.Tensor,
    bound: float,
    block: int,
    absolute: bool,
    learned: torch.Tensor | None,
    ceiling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`device_blocks` under ``rel`` (``absolute`` False) or ``abs`` ``bound``, with a
    learned absolute tolerance (float64 [1], or None) held between the bound and
    ``ceiling`` (``tiles_torch.tolerance``)."""
    return blocks(x, bound, block, absolute, learned, ceiling)


@device_blocks_bounded.register_fake
def _(x, bound, block, absolute, learned, ceiling) -> tuple[torch.Tensor, torch.Tensor]:
    return _blocks_fake(x, bound, block, absolute)


def blocks(x, bound, block, absolute, learned, ceiling):
    """The body of ``tensorpress::device_blocks_bounded``."""
    nsteps, bits = _slot(x.dtype, bound, absolute)
    triton = _block_kernels(x.device, block, x.numel())
    if triton is not None:
        x = x.contiguous()
        return triton.compress(x, bound, nsteps, bits, STEP_MARGIN, absolute, learned, ceiling)
    return blocks_reference.compress(
        x, bound, nsteps, bits, STEP_MARGIN, block, absolute, learned, ceiling
    )


def _blocks_fake(x, bound, block, absolute):
    nbytes = blocks_reference.worst_bytes(x.numel(), block, _slot(x.dtype, bound, absolute)[1])
    return x.new_empty(nbytes, dtype=torch.uint8), x.new_empty(1, dtype=torch.int64)


def blocks_restore(record, shape, dtype, block) -> torch.Tensor:
    """The body of ``tensorpress::device_blocks_restore``."""
    triton = _block_kernels(record.device, block, math.prod(shape))
    if triton is not None:
        return triton.restore(record, tuple(shape), dtype)
    return blocks_reference.restore(record, tuple(shape), dtype, block)


@torch.library.custom_op("tensorpress::device_blocks_restore", mutates_args=())
def device_blocks_restore(
    record: torch.Tensor, shape: Sequence[int], dtype: torch.dtype, block: int
) -> torch.Tensor:
    """The tensor of ``shape`` and ``dtype`` that ``record`` (whole or its used prefix)
    holds."""
    return blocks_restore(record, shape, dtype, block)


@device_blocks_restore.register_fake
def _(record, shape, dtype, block) -> torch.Tensor:
    return record.new_empty(tuple(shape), dtype=dtype)
