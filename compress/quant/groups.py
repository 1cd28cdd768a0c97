"""Group quantization of tensors to 2, 4 or 8 bits: the one definition (ActNN, SDP4Bit).

The ``quant`` codec's tensor path (:mod:`.quant`) frames the result into chunk
payloads, and the communication code (``tensorpress.distributed.wire``) into
wire rows; :mod:`.kernels.quant` is the numba twin the codec runs on numpy
chunks, held to the same bytes by tests/test_quant.py. Torch ops only, so the
same code runs on the CPU and on CUDA.

Each row of ``x [k, m]`` is quantized on its own:

1. it is cut into ``ngroups = ceil(m / group)`` groups of ``group`` values; the
   last is padded to ``group`` values (zeros under Hadamard, else copies of its
   last value, which leave its minimum and maximum unchanged);
2. Hadamard (optional): ``v = FWHT(s * x)`` per group (unnormalised butterflies,
   :func:`.kernels.torch_ops.fwht`) with random signs ``s`` (+1/-1) that the
   caller chooses; else ``v = x``;
3. ``lo = P(min(v) + 0.0)`` and ``scale = P((max(v) + 0.0 - lo) / (2**bits - 1))``,
   P the parameter dtype the caller stores (the ``+ 0.0`` stores a zero minimum
   as +0.0 whichever zero min picks);
4. ``code = clamp(floor((v - lo) / scale + u), 0, 2**bits - 1)``, 0 where
   ``scale <= 0`` or the quotient is NaN; ``u = 0.5`` (round to nearest) or
   noise in [0, 1) from the caller (stochastic rounding, unbiased);
5. inverse: ``v' = lo + code * scale``, then ``x' = s * FWHT(v') / group`` under
   Hadamard.

Steps 2-5 run in a compute dtype C that the caller chooses: the codec uses
float64, because its bytes must equal those of the numba kernels, which work in
float64; the wire uses float32, the dtype of the gradients and weights it
carries, so every pass moves half the bytes.

Error per value: at most ``scale / 2`` of its group with round to nearest,
below ``scale`` with stochastic rounding, plus rounding in C. Under Hadamard the
bound holds too, because ``|s * FWHT(e) / group|_i <= max_j |e_j|``; the
transform spreads an outlier over its group, so the typical error is much
smaller. A group holding a NaN or an infinity dequantizes to non-finite values.
"""

from __future__ import annotations

import math

import torch

from .kernels import torch_ops as qt

BITS = (2, 4, 8)


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


def layout(m: int, group: int) -> tuple[int, int]:
    """(groups, padded values) of a row of ``m`` values: ``ceil(m / group)``, times ``group``."""
    ngroups = -(-m // group)
    return ngroups, ngroups * group


def _groups(x, group: int, signs, compute):
    """Steps 1-2: ``v [k, ngroups, group]`` of rows ``x [k, m]``; without ``signs`` in x's
    dtype (the ops of steps 3-4 upcast it exactly), else rotated in ``compute``."""
    k, m = x.shape
    ngroups, width = layout(m, group)
    if signs is not None:
        v = torch.nn.functional.pad(x, (0, width - m)).view(k, ngroups, group)
        return qt.fwht(torch.mul(v, signs.to(compute)))
    v = x if width == m else torch.cat([x, x[:, -1:].expand(k, width - m)], 1)
    return v.reshape(k, ngroups, group)


def quantize(x, bits: int, group: int, *, param_dtype, compute_dtype, signs=None, noise=None):
    """Quantize each row of float tensor ``x [k, m]`` (no wider than ``compute_dtype``).

    ``signs``: Hadamard signs broadcastable to ``[k, ngroups, group]`` (None: no
    rotation); ``noise``: stochastic rounding draws in [0, 1) of that shape (None:
    round to nearest). Returns ``(codes, lo, scale)``: codes ``[k, ngroups * group]``
    as whole numbers in ``compute_dtype`` (the padding slots too), lo and scale
    ``[k, ngroups]`` in ``param_dtype``.
    """
    compute = compute_dtype
    v = _groups(x, group, signs, compute)
    maxc = float((1 << bits) - 1)
    lo_p = (v.amin(-1).to(compute) + 0.0).to(param_dtype)
    lo = lo_p.to(compute)
    scale_p = ((v.amax(-1).to(compute) + 0.0 - lo) / maxc).to(param_dtype)
    scale = scale_p.to(compute)[..., None]
    # groups with scale <= 0 divide by inf instead: (v - lo) / inf + u floors to code 0
    q = torch.sub(v, lo[..., None]).div_(torch.where(scale > 0.0, scale, math.inf))
    q.add_(0.5 if noise is None else noise)
    q = q.floor_().clamp_(0.0, maxc).nan_to_num_(0.0)
    return q.view(x.shape[0], v.shape[1] * group), lo_p, scale_p


def dequantize(codes, lo, scale, m: int, group: int, *, compute_dtype, signs=None):
    """Values ``[k, m]`` in ``compute_dtype`` of codes ``[k, ngroups * group]`` with their
    groups' ``lo`` and ``scale`` ``[k, ngroups]`` (``signs`` as given to :func:`quantize`).

    Codes already in ``compute_dtype`` (what :func:`quantize` returns) are overwritten:
    they hold the result.
    """
    k, ngroups = lo.shape
    compute = compute_dtype
    rec = codes.to(compute).reshape(k, ngroups, group)
    rec = rec.mul_(scale.to(compute)[..., None]).add_(lo.to(compute)[..., None])
    if signs is not None:
        rec = qt.fwht(rec).mul_(signs.to(compute)).div_(group)
    return rec.view(k, ngroups * group)[:, :m]


def pack(codes, bits: int):
    """Codes ``[k, c]`` (whole numbers in [0, 2**bits)) packed LSB first into uint8
    ``[k, ceil(c * bits / 8)]``, the last byte zero-padded (:func:`.kernels.torch_ops.pack`)."""
    return qt.pack(codes.to(torch.uint8), bits)


def unpack(packed, bits: int, count: int):
    """Inverse of :func:`pack`: uint8 codes ``[k, count]``."""
    return qt.unpack(packed, bits, count)
