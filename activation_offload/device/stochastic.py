"""Stochastic rounding for the fixed device codes (``codes.py``): unbiased codes.

``stochastic=True`` under a plain ``rel`` bound: the codes of ``codes.py`` under
``rel / 2`` (a step half as wide, one bit more a code), each rounded down or up,
``q = floor(v + u)`` for ``v = (x - lo) / step`` clamped to ``[0, nsteps]``, ``u``
uniform in [0, 1), so ``E[lo + q step] = x``. ``|r - x| < step`` where nearest rounding
has ``step / 2``, and rounding to the dtype at most doubles it, so every element keeps
``|x' - x| < 2 step <= rel (hi - lo)``: ``codes.py``'s argument with twice its error on
half its step. Restoring is ``codes.py``'s under ``rel / 2``, unchanged.

``u = (hash32(key, i) >> 8) * 2**-24`` for element ``i`` (``_util/hashing.py``), with
``key`` an int64 device scalar (so a new key each step recompiles nothing and is not
read by the host): the torch ops here and the Triton kernel (``codes_triton.py``,
``STOCHASTIC``) draw the same numbers and write the same bytes.
"""

from __future__ import annotations

import torch

from ..identity import VersionWatch
from ..records import Held, Watched, check_restored
from ..stats import ActivationStats
from . import codes_torch as reference
from . import ops
from .codes import DeviceCodes, restore_codes, supports
from .codes_layout import N_SCALARS, STEP_MARGIN, code_bits, payload_bytes, steps

M32 = 0xFFFFFFFF
# hash32's multipliers (``_util/hashing.py``), those >= 2**31 as c - 2**32: same low bits
_K_KEY, _K_HIGH = 0x9E3779B1 - (1 << 32), 0x632BE5AB
_K_MIX1, _K_MIX2 = 0x7FEB352D, 0x846CA68B - (1 << 32)


def uniform(key: torch.Tensor, n: int) -> torch.Tensor:
    """float64 draws in [0, 1) for elements ``0..n-1``, keyed on the int64 scalar tensor
    ``key`` (its low 32 bits), on ``key``'s device."""
    i = torch.arange(n, device=key.device, dtype=torch.int64)
    x = (i >> 32) * _K_HIGH + (i & M32) + (((key & M32) * _K_KEY) & M32)
    x = x & M32
    x = x ^ (x >> 16)
    x = (x * _K_MIX1) & M32
    x = x ^ (x >> 15)
    x = (x * _K_MIX2) & M32
    x = x ^ (x >> 16)
    return (x >> 8).to(torch.float64) * 2.0**-24


def quantize(flat: torch.Tensor, half: float, nsteps: int, key: torch.Tensor):
    """(codes int32, scalars ``[lo, hi, step]``) of non-empty ``flat``, rounded
    stochastically on the step of the bound ``half`` (``rel / 2``)."""
    q, scalars = reference.quantize(flat, half, nsteps, STEP_MARGIN)
    lo, step = scalars[0], scalars[2]
    x = flat.double()
    v = torch.where(step > 0, (x - lo) / step, 0.0).clamp(0, nsteps)
    up = (v + uniform(key, flat.numel())).floor().clamp(0, nsteps).to(torch.int32)
    finite = x.isfinite() & (x != 0)  # specials keep the codes quantize gave them
    return torch.where(finite, up, q), scalars


def compress(x: torch.Tensor, rel: float, key: torch.Tensor):
    """(payload uint8, scalars float64[3]) of ``x`` in stochastic codes under ``rel``."""
    half = rel / 2
    nsteps, bits = steps(half), code_bits(half)
    flat = x.reshape(-1)
    if flat.numel() == 0:
        empty = torch.empty(0, dtype=torch.uint8, device=x.device)
        return empty, torch.zeros(N_SCALARS, dtype=torch.float64, device=x.device)
    triton = ops._kernels(x.device)
    if triton is not None:
        return triton.compress(x.contiguous(), half, nsteps, bits, STEP_MARGIN, key)
    codes, scalars = quantize(flat, half, nsteps, key)
    return reference.pack(codes, bits), scalars


@torch.library.custom_op("tensorpress::device_codes_stochastic", mutates_args=())
def device_codes_stochastic(
    x: torch.Tensor, rel: float, key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(payload uint8, scalars float64 ``[lo, hi, step]``) of ``x`` in stochastic codes
    under ``rel``, noise keyed on the int64 scalar ``key``."""
    return compress(x, rel, key)


@device_codes_stochastic.register_fake
def _(x: torch.Tensor, rel: float, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    payload = x.new_empty(payload_bytes(x.numel(), code_bits(rel / 2)), dtype=torch.uint8)
    return payload, x.new_empty(N_SCALARS, dtype=torch.float64)


def stochastic_supports(dtype: torch.dtype, rel: float) -> bool:
    """Whether stochastic codes hold ``dtype`` under ``rel`` (its half must be a bound
    the fixed codes take)."""
    return supports(dtype, rel / 2)


def compress_stochastic(x: torch.Tensor, rel: float, key: torch.Tensor) -> DeviceCodes:
    """``x`` as stochastic codes within ``rel`` of its finite range: :class:`DeviceCodes`
    of the bound ``rel / 2`` (what restores them); nothing is read back to the host."""
    if not stochastic_supports(x.dtype, rel):
        raise ValueError(
            f"stochastic device codes hold float16, bfloat16 and float32 under rel >= twice "
            f"the fixed codes' least bound, got {x.dtype} with rel={rel!r}"
        )
    key = key.to(device=x.device, dtype=torch.int64).reshape(())
    payload, scalars = ops.eager(device_codes_stochastic, compress, x.detach(), float(rel), key)
    return DeviceCodes(payload, scalars, tuple(x.shape), x.dtype, float(rel) / 2)


class StochasticCompressed(Watched, Held):
    """A tensor held as stochastic :class:`DeviceCodes`, within ``rel`` of its range."""

    __slots__ = ("codes", "watch", "name", "original", "rel")
    mode = "rel"
    tolerance = None  # a device scalar, as for DeviceCompressed
    error = None

    def __init__(self, t, rel: float, key: int, stats: ActivationStats, name: str, debug: bool):
        self.rel = rel
        device_key = torch.tensor(key, dtype=torch.int64).to(t.device, non_blocking=True)
        self.codes = compress_stochastic(t, rel, device_key)
        self.watch = VersionWatch(t)
        self.name = name
        self.original = t.detach().clone() if debug else None
        super().__init__(self.codes.nbytes, stats)

    def restore(self) -> torch.Tensor:
        if self._keep is not None:
            return self._keep
        return restore_codes(self.codes)

    def check(self, y: torch.Tensor) -> None:
        """Raise AssertionError where ``y`` breaks the bound (debug mode reads the range)."""
        if self.original is None:
            return
        lo, hi, _ = self.codes.scalars.tolist()
        tol = self.rel * (hi - lo)
        check_restored(self.name, self.original, y, tol, tol)


def stochastic_device(config: dict) -> bool:
    """Whether ``config`` asks for stochastic rounding (the device path then takes only
    plain ``rel`` bounds, in these codes)."""
    return bool(config.get("codec_params", {}).get("stochastic", False))
