"""Group quantization of torch tensors to 2, 4 or 8 bits, on any device (SDP4Bit, ActNN).

The same torch ops run on the CPU and on CUDA. Values are computed in float32:

1. the input is flattened to ``n`` values and cut into ``ngroups = ceil(n / group)``
   groups of ``group`` values; the last group is padded to ``group`` values (with
   zeros under ``hadamard``, else with copies of its last value, which leaves its
   minimum and maximum unchanged);
2. ``hadamard``: ``v = FWHT(s * x)`` per group (unnormalised butterflies, see
   :func:`.kernels.quant_torch.fwht`), with random signs ``s_j`` of the position
   ``j`` in the group (the same for every group) from
   :func:`.kernels.quant_torch.signs` and ``seed``; else ``v = x``;
3. per group ``lo = min(v)``, ``scale = (max(v) - lo) / (2**bits - 1)``;
4. ``code = clamp(floor((v - lo) / scale + u), 0, 2**bits - 1)`` (every code 0 when
   ``scale == 0``), ``u = 0.5`` (round to nearest) or uniform in [0, 1) from a
   ``torch.Generator`` (stochastic rounding, unbiased);
5. ``x' = lo + code * scale``, then ``s * FWHT(x') / group`` under ``hadamard``.

Error per value: at most ``scale / 2`` of its group with round to nearest, below
``scale`` with stochastic rounding (plus float32 rounding, a few ulps of the
group's magnitude). Under ``hadamard`` the bound holds too, because
``|s * FWHT(e) / group|_i <= max_j |e_j|``; the transform spreads an outlier over
its group, so the typical error is much smaller than the bound. A group holding a
NaN or an infinity dequantizes to non-finite values (overflow checks still see
it).

Wire layout of ``n`` values (:func:`wire_nbytes` bytes, native byte order): the
``ngroups * group`` codes packed LSB first as :func:`.kernels.quant_torch.pack`
(without ``hadamard`` the padding slots hold code 0), then ``lo`` as float32
``[ngroups]``, then ``scale`` as float32 ``[ngroups]``. Row functions
(:func:`quantize_rows`, :func:`dequantize_rows`) quantize each row of a
``[k, m]`` tensor as its own ``n = m`` tensor into one wire row each, so equal
rows give equal-size buffers for ``all_to_all_single`` and ``all_gather``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from .kernels import quant_torch as qt

BITS = (2, 4, 8)
_F32 = 4  # bytes per lo / scale value


def _check_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    return v


def check_args(bits, group, hadamard=False, seed=0) -> None:
    """ValueError unless ``bits`` is 2, 4 or 8, ``group`` a positive int (a power of
    two under ``hadamard``) and ``seed`` an int in [0, 2**31)."""
    if _check_int("bits", bits) not in BITS:
        raise ValueError(f"bits must be 2, 4 or 8, got {bits!r}")
    if _check_int("group", group) < 1:
        raise ValueError(f"group must be a positive number of values, got {group!r}")
    if not isinstance(hadamard, bool):
        raise ValueError(f"hadamard must be true or false, got {hadamard!r}")
    if hadamard and group & (group - 1):
        raise ValueError(
            f"group must be a power of two with hadamard=True (e.g. 128), got {group!r}"
        )
    if not 0 <= _check_int("seed", seed) < 2**31:
        raise ValueError(f"seed must be in [0, 2**31), got {seed!r}")


def _layout(n: int, bits: int, group: int) -> tuple[int, int]:
    """(groups, packed code bytes) of ``n`` values."""
    ngroups = -(-n // group)
    return ngroups, (ngroups * group * bits + 7) // 8


def wire_nbytes(n: int, bits: int, group: int) -> int:
    """Bytes on the wire for ``n`` values: ``ceil(ceil(n / group) * group * bits / 8)``
    code bytes plus 8 bytes (float32 lo and scale) per group."""
    if _check_int("n", n) < 0:
        raise ValueError(f"n must be a count of values >= 0, got {n!r}")
    check_args(bits, group)
    ngroups, code_bytes = _layout(n, bits, group)
    return code_bytes + 2 * _F32 * ngroups


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
    """codes ``[k, code bytes]``, lo and scale ``[k, ngroups]`` of float32 rows ``x``."""
    k, m = x.shape
    ngroups, _ = _layout(m, bits, group)
    width = ngroups * group
    if hadamard:
        v = torch.nn.functional.pad(x, (0, width - m)).view(k, ngroups, group)
        v = qt.fwht(v * _signs(seed, group, x.device))
    else:
        v = x if width == m else torch.cat([x, x[:, -1:].expand(k, width - m)], 1)
        v = v.reshape(k, ngroups, group)
    maxc = float((1 << bits) - 1)
    lo = v.amin(-1) + 0.0  # + 0.0: a -0.0 minimum is stored as +0.0
    scale = (v.amax(-1) - lo) / maxc
    q = torch.sub(v, lo[..., None]).div_(torch.where(scale > 0, scale, math.inf)[..., None])
    if stochastic:
        if generator is None:
            generator = torch.Generator(device=x.device).manual_seed(seed)
        u = torch.rand(q.shape, generator=generator, device=generator.device)
        q.add_(u.to(q.device))
    else:
        q.add_(0.5)
    q = q.floor_().clamp_(0.0, maxc).nan_to_num_(0.0).to(torch.uint8).view(k, width)
    if width != m and not hadamard:
        q[:, m:] = 0
    return qt.pack(q, bits), lo, scale


@torch.no_grad()
def _dequantize(codes, lo, scale, m, bits, group, hadamard, seed) -> torch.Tensor:
    """float32 ``[k, m]`` from codes ``[k, code bytes]``, lo and scale ``[k, ngroups]``."""
    k = codes.shape[0]
    ngroups, _ = _layout(m, bits, group)
    width = ngroups * group
    q = qt.unpack(codes, bits, width).to(torch.float32).view(k, ngroups, group)
    rec = q.mul_(scale[..., None]).add_(lo[..., None])
    if hadamard:
        rec = qt.fwht(rec).mul_(_signs(seed, group, codes.device)).div_(group)
    return rec.view(k, width)[:, :m]


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
    ngroups, code_bytes = _layout(m, bits, group)
    if ngroups == 0:
        empty = wire.new_empty((wire.shape[0], 0), dtype=torch.float32)
        return wire[:, :0], empty, empty
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
    check_args(bits, group, hadamard, seed)
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("quantize_rows takes a 2-d tensor [rows, values per row]")
    codes, lo, scale = _quantize(_as_rows(x), bits, group, hadamard, stochastic, seed, generator)
    return torch.cat([codes, lo.view(torch.uint8), scale.view(torch.uint8)], 1)


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
