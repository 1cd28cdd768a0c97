"""Block codes for tensors under a ``rel`` or ``abs`` bound, or a learned tolerance between
the bound and a ceiling: per-block widths on the device, with no host read when they are
made.

Why a second layout. The fixed-width codes (``codes.py``) hold every tensor at the
width the bound allows its worst case, ``32 / bits`` at best; what holds fewer bytes is
data-dependent. Here each block of ``BLOCK`` elements keeps its codes relative to its
smallest one, at the width its own code range needs: a block of zeros (after a ReLU)
takes no bits, a block of an activation whose range is set by a few outliers takes the
bits of its own spread. The codes' meaning and the restore are the fixed layout's (the
bound's reasoning is in ``codes.py``), so every element keeps
``|x' - x| <= rel * (hi - lo)``; where the codes go differs
(``tiles_torch.py`` has the record's bytes), and so may the step.

A step twice as coarse, chosen on the device. The fixed layout's step, ``tol (1 -
2**-7)`` with ``tol = rel * (hi - lo)``, leaves room for rounding the float64 value to
the dtype, which can move it as far as quantizing did. Where that rounding is small
next to ``tol`` (``M 2**-(mant + 1) <= tol 2**-8``, ``M`` the larger of ``|lo|``,
``|hi|`` and the dtype's smallest normal, ``mant`` its mantissa bits: float32 tensors
whose range is not tiny next to their magnitude), the step is doubled: half a step,
``tol (1 - 2**-7)``, plus the rounding, ``tol 2**-8``, plus the float64 arithmetic's
``tol 2**-9`` stay inside ``tol``. The choice is one ``where`` on device scalars; the
slot keeps the fine step's size, and the block widths take the bit saved.

A learned tolerance (adaptive bounds, ``activation_offload/adaptive.py``): a float64 device
scalar ``e``, used as ``min(max(e, rel (hi - lo)), ceiling (hi - lo))``, computed where
the range is, in the kernel. It never falls below the ``rel`` tolerance, so no code passes
the ``rel`` bound's ``nsteps`` and the slot sized for ``rel`` holds every such tensor;
and every step of the proof above holds with ``tol`` in place of ``rel (hi - lo)``: the
step is ``tol (1 - 2**-7)`` (doubled by the same test), the float64 arithmetic's error
only shrinks next to a larger ``tol``.

``abs`` bounds. The steps across a range have no ceiling under ``abs``, so a slot sized
before the kernel runs needs a fallback that is exact: a block whose code width would
reach the dtype's own bits is stored raw, its values' bits at the dtype's width (exact,
NaN and infinities included), and so is one with an element more than ``2**30`` steps
from ``lo`` (bases stay int32) or, for the whole tensor, a largest magnitude ``M`` over
``2**39`` times the bound. That last test keeps the float64 arithmetic's error, at most
about ``2**-50 (hi - lo) + 2**-51 M``, below ``2**-9`` of the bound, inside the margin
(under ``rel`` the range itself keeps it so). The worst case is then the raw size plus the
headers (5 bytes a block of 256, 24 a tensor), known from the element count and the
dtype; the lagged compaction below shrinks it to the bytes in use, so what stays held is
the raw bits only where the bound asks for them. The other design, a width learned from
the previous step of the same tensor kind with an overflow flag, keeps a smaller slot but
needs the original kept until the flag reaches the host, and a host read to act on it;
the raw fallback needs neither. Raw blocks also cap widths under ``rel``: a float16
tensor at ``rel`` 1e-5 takes no more than its own 16 bits a value.

Its memory behaviour. The record is written into a slot of the worst case's size, known
from the element count and the bound alone, so the kernel runs with nothing read back;
the bytes in use are a device scalar. :class:`LaggedSize` copies that scalar without
blocking into pinned host memory behind a CUDA event, and a caller compacts the record
(one device copy of its used prefix, the slot freed) once the event has completed, asked
with ``event.query()``, never waited for. So a slot lives only as long as the GPU lags
the CPU, no host thread waits, and what stays held is the compact record. On the CPU the
size is known at once; on meta tensors never (records stay at their worst size). The
restore reads the layout from the record itself, so it takes the slot or the compact
copy alike. Compiled graphs and CUDA graphs keep the fixed layout: a record's size there
must be a graph constant.

The block size: 256 elements. The header takes 5 bytes a block (an int32 base, a uint8
width); smaller blocks follow local ranges more closely but pay that more often, and
from 64 to 256 elements the two balance on the CNN and the byte-level LM of
``benchmarks/activations.py`` (its device rows), while 512 holds more. A byte-level LM's
saved tensors spread over their whole range in nearly every block: there blocks hold
about what the fixed width holds, and what holds fewer bytes (GELU outputs restored from
their inputs, entropy coding) is the host path's.

The kernels: a torch reference (``tiles_torch.py``, any device) and, on
CUDA with ``triton`` installed, Triton kernels (``tiles_triton.py``) that
write the same bytes and restore the same values (two launches to compress, the second
finding each block's offset by a look-back; two to restore), through the custom ops
``tensorpress::device_blocks`` / ``device_blocks_restore`` (``ops.py``), whose fake
implementations give the slot's and the tensor's shapes.

On CUDA the pinned size tensors come from torch's caching host allocator, which reuses a
block once the copy recorded on it has completed, so steady-state steps allocate no
pinned memory.
"""

from __future__ import annotations

import math

import torch

from . import ops
from .codes_layout import DTYPES, MIN_REL, code_bits, supports
from .tiles_torch import (
    SCALAR_BYTES,
    header_bytes,
    slot_bits,
    tolerance,
    worst_bytes,
)

__all__ = [
    "BLOCK",
    "LaggedSize",
    "compress_blocks",
    "held_tolerance",
    "restore_blocks",
    "worst_size",
]

#: elements a block holds
BLOCK = 256


def worst_size(numel: int, rel=None, block: int = BLOCK, *, dtype=torch.float32, abs=None):
    """Bytes of the slot a record of ``numel`` elements of ``dtype`` is written into, under
    ``rel`` or ``abs`` (the raw size plus headers: no ceiling on its steps)."""
    bits = slot_bits(dtype, None if abs is not None else code_bits(rel))
    return worst_bytes(numel, block, bits)


def smallest_size(numel: int, block: int = BLOCK) -> int:
    """Bytes of the smallest record of ``numel`` elements (every block constant)."""
    return header_bytes(numel, block) + 4


def compress_blocks(
    x: torch.Tensor,
    rel=None,
    block: int = BLOCK,
    *,
    abs=None,
    learned: torch.Tensor | None = None,
    ceiling=None,
):
    """(slot uint8 of :func:`worst_size` bytes, used: int64[1] on the device, the bytes
    of the slot's prefix that hold the record) of ``x`` (float16, bfloat16 or float32)
    within ``rel`` of its finite range or within ``abs``; with ``learned`` (a float64
    device scalar, one element) within that tolerance held between the bound and
    ``ceiling`` (in the bound's units). Nothing is read back to the host."""
    _check(x, rel, abs, block)
    if learned is not None:
        if not (isinstance(ceiling, (int, float)) and ceiling >= (rel if abs is None else abs)):
            raise ValueError(f"a learned tolerance needs a ceiling >= the bound, got {ceiling!r}")
        if learned.numel() != 1 or learned.dtype != torch.float64:
            raise ValueError("learned takes a float64 tensor of one element")
    bound, absolute = (float(rel), False) if abs is None else (float(abs), True)
    if learned is None and not absolute:
        args = (x.detach(), bound, block)
        return ops.eager(ops.device_blocks, ops.rel_blocks, *args)
    ceiling = 0.0 if ceiling is None else float(ceiling)
    args = (x.detach(), bound, block, absolute, learned, ceiling)
    return ops.eager(ops.device_blocks_bounded, ops.blocks, *args)


def _check(x: torch.Tensor, rel, abs, block) -> None:
    if (rel is None) == (abs is None):
        raise ValueError(f"block codes take exactly one of rel= and abs=, got {rel=}, {abs=}")
    if abs is not None:
        ok = isinstance(abs, (int, float)) and math.isfinite(abs) and abs >= 0
        if x.dtype not in DTYPES or not ok:
            raise ValueError(
                f"block codes hold {', '.join(str(d) for d in DTYPES)} under a finite abs "
                f">= 0, got {x.dtype} with abs={abs!r}"
            )
    elif not supports(x.dtype, rel):
        raise ValueError(
            f"block codes hold {', '.join(str(d) for d in DTYPES)} under rel >= {MIN_REL}, "
            f"got {x.dtype} with rel={rel!r}"
        )
    if not (isinstance(block, int) and block > 0 and block % 32 == 0):
        raise ValueError(f"block must be a positive multiple of 32, got {block!r}")


def held_tolerance(record: torch.Tensor, rel=None, abs=None, learned=None, ceiling=None):
    """The absolute bound a record made under these settings keeps, as a host float: reads
    its range (and the learned tolerance) back, for checks outside the training step."""
    lo, hi = record[:SCALAR_BYTES].view(torch.float64)[:2].double()
    bound, absolute = (rel, False) if abs is None else (abs, True)
    ceiling = 0.0 if ceiling is None else ceiling
    return float(tolerance(lo, hi, float(bound), absolute, learned, float(ceiling)))


def restore_blocks(record: torch.Tensor, shape, dtype: torch.dtype, block: int = BLOCK):
    """The tensor a record (its slot, or the slot's used prefix) holds, on its device."""
    args = (record, list(shape), dtype, block)
    return ops.eager(ops.device_blocks_restore, ops.blocks_restore, *args)


class LaggedSize:
    """A device int64 scalar on its way to the host: copied without blocking into pinned
    memory behind an event on CUDA, known at once on the CPU, never on meta tensors."""

    __slots__ = ("host", "event")

    def __init__(self, value: torch.Tensor):
        self.event = None
        if value.device.type == "meta":
            self.host = None
            return
        if value.device.type == "cuda":
            self.host = torch.empty(1, dtype=torch.int64, pin_memory=True)
            self.host.copy_(value, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = value.reshape(1)

    def ready(self) -> bool:
        """Whether :meth:`value` returns without waiting (never waits to find out)."""
        return self.host is not None and (self.event is None or self.event.query())

    def value(self) -> int:
        """The scalar; only once :meth:`ready`: a read of host memory, no device sync."""
        return read_host(self.host)


def read_host(host: torch.Tensor) -> int:
    """The int in one-element host tensor ``host`` (pinned, its copy complete)."""
    return int(host.tolist()[0])
