"""Group-quantized tensors as uint8 wire buffers for torch.distributed collectives.

The quantization is :mod:`tensorpress.compress.quant.groups`'s, with float32
``lo``/``scale`` and float32 arithmetic (gradients and weights are float32). Two
choices are the wire's own:

* Hadamard signs ``s_j`` come from ``hash32(2*seed + 1, j)``, ``j`` the position in
  the group, so every group shares one ``[group]`` sign vector;
* stochastic rounding draws its noise from a ``torch.Generator`` (seeded with
  ``seed`` when none is given), so a training loop that passes one generator gets
  fresh noise every step.

Wire layout of ``n`` values (:func:`wire_nbytes` bytes, native byte order): the
``ngroups * group`` codes packed LSB first (without ``hadamard`` the padding slots
hold code 0), then ``lo`` as float32 ``[ngroups]``, then ``scale`` as float32
``[ngroups]``. Row functions (:func:`quantize_rows`, :func:`dequantize_rows`)
quantize each row of a ``[k, m]`` tensor as its own ``n = m`` tensor into one wire
row each, so equal rows give equal-size buffers for ``all_to_all_single`` and
``all_gather``. Nothing on the wire is stored: both ends run the same version.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..compress.quant import groups as gq
from ..compress.quant.groups import BITS, check_args
from ..compress.quant.kernels import torch_ops as qt

__all__ = [
    "BITS",
    "GroupQuantized",
    "check_args",
    "dequantize_groups",
    "dequantize_rows",
    "quantize_groups",
    "quantize_rows",
    "quantize_rows_scaled",
    "row_scales",
    "wire_nbytes",
]

_F32 = 4  # bytes per lo / scale value
_F32_ARITH = torch.float32  # lo/scale and the arithmetic: the values are float32 already


def wire_nbytes(n: int, bits: int, group: int) -> int:
    """Bytes on the wire for ``n`` values: ``ceil(ceil(n / group) * group * bits / 8)``
    code bytes plus 8 bytes (float32 lo and scale) per group."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a count of values >= 0, got {n!r}")
    check_args(bits, group)
    ngroups, width = gq.layout(n, group)
    return (width * bits + 7) // 8 + 2 * _F32 * ngroups


@functools.lru_cache(maxsize=32)
def _signs(seed: int, group: int, device) -> torch.Tensor:
    """float32 random signs ``[group]`` of the positions in a group."""
    return qt.signs(seed, torch.arange(group, device=device)).to(torch.float32)


def _as_rows(x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"group quantization takes a float tensor, got {got}")
    return x.to(torch.float32)


@torch.no_grad()
def _quantize(x, bits, group, hadamard, stochastic, seed, generator):
    """Packed codes ``[k, code bytes]``, lo and scale ``[k, ngroups]`` of float32 rows ``x``."""
    k, m = x.shape
    ngroups, _ = gq.layout(m, group)
    signs = _signs(seed, group, x.device) if hadamard else None
    noise = None
    if stochastic:
        if generator is None:
            generator = torch.Generator(device=x.device).manual_seed(seed)
        shape = (k, ngroups, group)
        noise = torch.rand(shape, generator=generator, device=generator.device).to(x.device)
    codes, lo, scale = gq.quantize(
        x, bits, group, param_dtype=_F32_ARITH, compute_dtype=_F32_ARITH, signs=signs, noise=noise
    )
    if not hadamard:
        codes[:, m:] = 0  # the padding copies of the last value go out as code 0
    return gq.pack(codes, bits), lo, scale


@torch.no_grad()
def _dequantize(codes, lo, scale, m, bits, group, hadamard, seed) -> torch.Tensor:
    """float32 ``[k, m]`` from packed codes ``[k, code bytes]``, lo and scale ``[k, ngroups]``."""
    width = gq.layout(m, group)[1]
    signs = _signs(seed, group, codes.device) if hadamard else None
    codes = gq.unpack(codes, bits, width)
    return gq.dequantize(codes, lo, scale, m, group, compute_dtype=_F32_ARITH, signs=signs)


@dataclass
class GroupQuantized:
    """A group-quantized tensor; every tensor lives on the input's device."""

    codes: torch.Tensor  #: uint8 codes packed LSB first, groups padded to ``group``
    lo: torch.Tensor  #: float32 ``[ngroups]`` per-group minimum (after the transform)
    scale: torch.Tensor  #: float32 ``[ngroups]``: ``(max - lo) / (2**bits - 1)``
    n: int  #: values quantized (before padding)
    bits: int
    group: int
    hadamard: bool
    seed: int

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: codes + lo + scale (equals :func:`wire_nbytes`)."""
        return self.codes.numel() + _F32 * (self.lo.numel() + self.scale.numel())

    def to_wire(self) -> torch.Tensor:
        """One uint8 tensor of :attr:`nbytes`: codes, then lo, then scale bytes."""
        return torch.cat([self.codes, self.lo.view(torch.uint8), self.scale.view(torch.uint8)])

    @classmethod
    def from_wire(cls, buf, n, bits, group, hadamard=False, seed=0) -> GroupQuantized:
        """Inverse of :meth:`to_wire`; the layout arguments must be those used to quantize."""
        check_args(bits, group, hadamard, seed)
        expected = wire_nbytes(n, bits, group)
        if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 1:
            raise ValueError("from_wire needs a 1-d uint8 tensor")
        if buf.numel() != expected:
            raise ValueError(
                f"wire buffer has {buf.numel()} bytes, expected {expected} for {n} values "
                f"(bits={bits}, group={group})"
            )
        codes, lo, scale = _split_wire(buf[None], n, bits, group)
        return cls(codes[0], lo[0], scale[0], n, bits, group, hadamard, seed)


def _split_wire(wire, m, bits, group):
    """codes, lo, scale of wire rows ``[k, wire_nbytes(m)]`` (lo/scale are copies)."""
    ngroups, width = gq.layout(m, group)
    if ngroups == 0:
        empty = wire.new_empty((wire.shape[0], 0), dtype=torch.float32)
        return wire[:, :0], empty, empty
    code_bytes = (width * bits + 7) // 8
    at = code_bytes + _F32 * ngroups
    lo = qt.bytes_as(wire[:, code_bytes:at], torch.float32)
    scale = qt.bytes_as(wire[:, at:], torch.float32)
    return wire[:, :code_bytes], lo, scale


def quantize_groups(
    x, *, bits=4, group=128, hadamard=False, stochastic=False, seed=0, generator=None
) -> GroupQuantized:
    """Quantize float tensor ``x`` (any shape and device, flattened) in groups of ``group``
    values; ``seed`` keys the Hadamard signs, and the rounding noise unless a
    ``generator`` is given. See the module docstring for the arithmetic."""
    check_args(bits, group, hadamard, seed)
    flat = _as_rows(x).reshape(1, -1)
    codes, lo, scale = _quantize(flat, bits, group, hadamard, stochastic, seed, generator)
    return GroupQuantized(codes[0], lo[0], scale[0], flat.shape[1], bits, group, hadamard, seed)


def dequantize_groups(q: GroupQuantized) -> torch.Tensor:
    """float32 ``[q.n]`` values of a :class:`GroupQuantized`."""
    rows = _dequantize(
        q.codes[None], q.lo[None], q.scale[None], q.n, q.bits, q.group, q.hadamard, q.seed
    )
    return rows[0]


def quantize_rows(
    x, *, bits=4, group=128, hadamard=False, stochastic=False, seed=0, generator=None
) -> torch.Tensor:
    """Wire buffers uint8 ``[k, wire_nbytes(m, bits, group)]`` of the rows of float tensor
    ``x [k, m]``; row ``i`` holds the bytes of ``quantize_groups(x[i]).to_wire()`` (with
    stochastic rounding, the noise of all rows comes from one draw)."""
    return quantize_rows_scaled(
        x, bits=bits, group=group, hadamard=hadamard, stochastic=stochastic, seed=seed,
        generator=generator,
    )[0]  # fmt: skip


def quantize_rows_scaled(
    x, *, bits=4, group=128, hadamard=False, stochastic=False, seed=0, generator=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_rows`'s wire rows and the float32 group scales ``[k, ngroups]`` they
    hold. The scales are all finite exactly when every group's values are finite and
    their range (after the transform) fits float32."""
    check_args(bits, group, hadamard, seed)
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("quantize_rows takes a 2-d tensor [rows, values per row]")
    codes, lo, scale = _quantize(_as_rows(x), bits, group, hadamard, stochastic, seed, generator)
    return torch.cat([codes, lo.view(torch.uint8), scale.view(torch.uint8)], 1), scale


def _check_wire_rows(wire, m, bits, group) -> None:
    if not isinstance(wire, torch.Tensor) or wire.dtype != torch.uint8 or wire.dim() != 2:
        raise ValueError("wire rows must be a 2-d uint8 tensor [rows, bytes per row]")
    expected = wire_nbytes(m, bits, group)
    if wire.shape[1] != expected:
        raise ValueError(
            f"wire rows have {wire.shape[1]} bytes, expected {expected} for {m} values "
            f"(bits={bits}, group={group})"
        )


def dequantize_rows(wire, m, bits, group, hadamard=False, seed=0) -> torch.Tensor:
    """float32 ``[k, m]`` from wire rows ``[k, wire_nbytes(m, bits, group)]`` written by
    :func:`quantize_rows` with the same arguments."""
    check_args(bits, group, hadamard, seed)
    _check_wire_rows(wire, m, bits, group)
    codes, lo, scale = _split_wire(wire, m, bits, group)
    return _dequantize(codes, lo, scale, m, bits, group, hadamard, seed)


def row_scales(wire, m, bits, group) -> torch.Tensor:
    """float32 ``[k, m]``: the scale of each value's group, read from wire rows (half of it
    bounds a value's round-to-nearest error)."""
    check_args(bits, group)
    _check_wire_rows(wire, m, bits, group)
    scale = _split_wire(wire, m, bits, group)[2]
    return scale.repeat_interleave(group, dim=1)[:, :m]
