"""The codec side of activation compression: one registered codec, used on saved tensors.

``ActivationCodec`` turns a saved tensor into a payload and back. What it may do is read
from the codec's declared class attributes (``lossy``, ``bounded``, ``has_tensor_path``,
``dtypes``), never from its name: a codec with a torch tensor path compresses on the
tensor's own device (``compress_tensor``); one without goes through the host and the
container (``tensorpress.formats``). ``Int8Codes`` stand in for the ``block`` codec's
payload where one byte a value is all its codes need, ``FixedCodes`` where the codec's
packings save too little over one width for the codes of a kind of tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..compress import ErrorBound, compress_tensor, decompress_tensor, get_codec
from ..compress.block import BlockCodec, int8_decode, int8_encode, steps_for
from ..compress.block.kernels.encode import check_free_codes
from ..compress.block.stochastic import derive_seed
from ..compress.kernels.rounding import PREC_FLOAT32, PREC_FLOAT64
from ..formats import decode_array, encode_array
from .kernels import pack_fixed, unpack_fixed
from .zstd_stage import ZstdStage, unsqueeze

#: steps a tensor's range spans from which its codes go into int8 (they need 6 bits or more)
INT8_MIN_STEPS = 64
#: the same for a record parked in a store with a file tier (5 bits or more) whose kind
#: the zstd stage is not taking: there the bytes go to disk and the codec's time is what
#: the step pays, so a single-pass byte a value wins from fewer steps on (see
#: benchmarks/offload.py, run (e))
INT8_MIN_STEPS_SPILLED = 32
#: a kind of tensor whose codes fit 8 bits is held in fixed-width codes while the
#: codec's packings (and the zstd stage) save less than this share of the bytes those
#: take: then a fixed width holds at most 5/3 of the codec's bytes, at about a quarter
#: of the codec's time each way. At 0.25 the held-out ViT's adaptive bounds (4 to 6
#: bits a code) kept most of its tensors in the codec, at about 10 ns of CPU a byte
#: saved, for a ratio of 13.8x where 8x was asked (``benchmarks/activations.py``)
FIXED_MIN_GAIN = 0.4
#: a kind held in fixed-width codes is tried with the codec again after this many tensors
FIXED_RETRY_AFTER = 32


class ActivationCodec:
    """A registered lossy codec (``name`` with ``params``) applied to saved tensors of any
    device; ``zstd``: the level of the lossless stage for payloads in host memory
    (``zstd_stage.py``), or None."""

    def __init__(self, name: str, params: dict, zstd: int | None = None):
        codec = get_codec(name, **params)  # bad parameters fail here, not at the first save
        if not codec.lossy:
            raise ValueError(
                f"activation codec must be a lossy codec or None, got the lossless {name!r}"
            )
        self.codec = codec
        self.name = name
        self.params = dict(params)
        self.bounded = codec.bounded
        self.keeps_zeros = codec.keeps_zeros
        # the int8 codec restores what BlockCodec restores (same step, same rounding)
        self.int8_codes = isinstance(codec, BlockCodec) and not codec.stochastic
        self.zstd = None if zstd is None else ZstdStage(zstd)
        self.fixed = FixedChoice() if self.int8_codes else None
        # stochastic rounding: each tensor draws its own noise, seeded by (seed, step,
        # its index in the step; ActivationCompression starts each step), so the same
        # seed repeats a step's bytes, also in a run resumed from a state dict
        self.seeded = bool(self.params.get("stochastic", False))
        self.step, self._index = 0, 0

    def start_step(self, step: int) -> None:
        """Key the next tensors' noise on ``step`` (their index counts from 0 again)."""
        self.step, self._index = int(step), 0

    def next_seed(self) -> int:
        """The seed of the next tensor's noise: from (seed, step, its index in the step)."""
        self._index += 1
        return derive_seed(self.params.get("seed", 0), self.step, self._index)

    def _params(self) -> dict:
        """The codec's parameters for the next tensor (its own seed where seeded)."""
        return dict(self.params, seed=self.next_seed()) if self.seeded else self.params

    @property
    def on_device(self) -> bool:
        """Whether payloads stay on the tensor's device (a torch tensor path); otherwise
        they are host bytes, which no store holds."""
        return self.codec.has_tensor_path

    def compress(
        self,
        t: torch.Tensor,
        mode: str | None,
        tol: float | None,
        kind=None,
        span=None,
        held: str = "memory",
    ):
        """(payload, bytes held) for ``t``; ``mode`` 'abs' or 'pw_rel' with ``tol``;
        ``kind`` (hashable) groups tensors for the zstd stage's choices; ``span``: t's
        ValueRange where int8 codes may hold it (abs); ``held``: where the payload goes.
        In "memory" int8 codes take it from ``INT8_MIN_STEPS`` steps; in "files" (a
        store's) from ``INT8_MIN_STEPS_SPILLED`` unless the zstd stage is taking its kind
        (int8 codes skip that stage); in "pool" (a store without files, whose host pool
        is its budget) never."""
        skipped = False  # the zstd stage has counted this payload as one it skips
        if self.int8_codes and mode == "abs" and span is not None and held != "pool":
            steps = INT8_MIN_STEPS
            if held == "files":
                skipped = self.zstd is not None and self.zstd.skip(kind)
                steps = INT8_MIN_STEPS_SPILLED if self.zstd is None or skipped else steps
            codes = Int8Codes.of(t, tol, span, steps)
            if codes is not None:
                return codes, codes.nbytes
        plan = None  # (low, width) of fixed-width codes, where they can hold t
        if self.fixed is not None and mode == "abs" and span is not None and held == "memory":
            plan = FixedCodes.plan(t, tol, span)
            if plan is not None and self.fixed.take(kind):
                codes = FixedCodes.of(t, tol, *plan)
                return codes, codes.nbytes
        bound = {mode: tol} if self.bounded else {}
        if not self.on_device:
            blob = self._host_stream(t, bound)
            return blob, len(blob)
        ct = compress_tensor(t, self.name, **bound, **self._params())
        if self.zstd is not None and not skipped:
            ct = self.zstd.squeeze(ct, kind)
        if plan is not None:
            self.fixed.note(kind, ct.nbytes, FixedCodes.size(t.numel(), plan[1]))
        return ct, ct.nbytes

    def _host_stream(self, t: torch.Tensor, bound: dict) -> bytes:
        """``t`` as a container stream, compressed on the host."""
        if str(t.dtype).removeprefix("torch.") not in self.codec.dtypes:
            raise TypeError(
                f"the {self.name} codec cannot hold {t.dtype} activations within the bound "
                f"(it takes {', '.join(self.codec.dtypes)}); use codec='block'"
            )
        arr = t.detach().cpu().numpy()
        resolved = ErrorBound.from_kwargs(**bound).resolve(arr) if bound else None
        return encode_array(arr, self.codec, resolved, chunk_bytes=self.codec.default_chunk_bytes)

    def decompress(self, payload, device) -> torch.Tensor:
        if isinstance(payload, (Int8Codes, FixedCodes)):
            return payload.restore()
        if isinstance(payload, bytes):  # a host stream
            arr = decode_array(payload)
            if not arr.flags.writeable:  # a view of the stream's bytes
                arr = arr.copy()
            return torch.from_numpy(arr).to(device)
        return decompress_tensor(unsqueeze(payload))


@dataclass(frozen=True)
class Int8Codes:
    """A CPU tensor held as int8 codes ``q = rint(x / step)`` under an absolute bound.

    Where a tensor's codes need 6 to 8 bits (its range spans 64 to 254 steps of twice the
    bound), one byte a value is at most 4/3 of what the ``block`` codec's densest packing
    holds, and a single pass writes it, so the step is faster for a small loss in ratio
    (see benchmarks/activations.py). Records bound for a store's files take them from 32
    steps (5 bits; see ``INT8_MIN_STEPS_SPILLED``). The values restored are the ``block``
    codec's (same step, same rounding).
    """

    payload: torch.Tensor  # int8, flat
    tol: float  # the absolute bound the codes were made for
    shape: tuple
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return self.payload.numel()

    @property
    def step(self) -> float:
        """The quantization step the codes count in."""
        return steps_for(self.tol)[0]

    @staticmethod
    def of(t: torch.Tensor, tol: float, span, min_steps: int = INT8_MIN_STEPS) -> Int8Codes | None:
        """``t``'s codes within ``tol`` (``span``: its ValueRange), or None where they do
        not fit int8, its range spans fewer than ``min_steps`` steps, or ``t`` is not a
        float32/64 CPU tensor."""
        if t.device.type != "cpu" or t.dtype not in (torch.float32, torch.float64):
            return None
        lo, hi = span.ends
        inv = steps_for(tol)[1]
        if not (tol > 0 and (hi - lo) * inv >= min_steps and max(-lo, hi) * inv <= 126):
            return None  # (NaN and infinities fail here too)
        codes = int8_encode(t.detach().contiguous().reshape(-1).numpy(), tol)
        if codes is None:
            return None
        return Int8Codes(torch.from_numpy(codes), tol, tuple(t.shape), t.dtype)

    def restore(self) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype)
        int8_decode(self.payload.numpy(), self.tol, out.reshape(-1).numpy())
        return out


class FixedChoice:
    """Which kinds of tensor go into fixed-width codes: a kind whose last payload from the
    codec (after the zstd stage) held more than ``1 - FIXED_MIN_GAIN`` of the bytes fixed
    codes take is held in them for its next ``FIXED_RETRY_AFTER`` tensors."""

    def __init__(self):
        self._left: dict = {}  # kind -> tensors it is still held in fixed codes for

    def take(self, kind) -> bool:
        """Whether the next tensor of ``kind`` goes into fixed-width codes."""
        left = self._left.get(kind, 0)
        if left <= 0:
            self._left.pop(kind, None)  # its next tensor measures the codec again
            return False
        self._left[kind] = left - 1
        return True

    def note(self, kind, held: int, fixed: int) -> None:
        """The codec held a tensor of ``kind`` in ``held`` bytes; fixed codes take ``fixed``."""
        if held > (1 - FIXED_MIN_GAIN) * fixed:
            if len(self._left) >= 4096:  # shapes that vary from step to step add kinds
                self._left.clear()
            self._left[kind] = FIXED_RETRY_AFTER


@dataclass(frozen=True)
class FixedCodes:
    """A CPU tensor held as codes ``q - low`` of ``width`` (1..8) bits, ``q = rint(x /
    step)`` under an absolute bound, 8 codes in ``width`` bytes (``kernels.pack_fixed``).

    The values restored are the ``block`` codec's (same step, same rounding), and every
    code lies within those the block quantizer is proven to restore within the bound
    unchecked (``check_free_codes``), so no value needs a check."""

    payload: torch.Tensor  # uint8, flat, 8 spare bytes at the end
    tol: float
    low: int  # the least code
    width: int  # bits a code
    shape: tuple
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return self.payload.numel()

    @staticmethod
    def size(n: int, width: int) -> int:
        """Bytes the codes of ``n`` values at ``width`` bits take."""
        return (n * width + 7) // 8 + 8

    @staticmethod
    def plan(t: torch.Tensor, tol: float, span) -> tuple[int, int] | None:
        """(low, width) of ``t``'s codes within ``tol`` (``span``: its ValueRange), or None
        where they need more than 8 bits or a check, or ``t`` is not a float32/64 CPU
        tensor (NaN and infinities too)."""
        if t.device.type != "cpu" or t.dtype not in (torch.float32, torch.float64):
            return None
        lo, hi = span.ends
        if not (tol > 0 and math.isfinite(lo) and math.isfinite(hi)):
            return None
        step, inv = steps_for(tol)
        low, high = int(np.rint(lo * inv)), int(np.rint(hi * inv))  # as the kernel rounds
        prec = PREC_FLOAT32 if t.dtype == torch.float32 else PREC_FLOAT64
        if max(-low, high) > check_free_codes(prec, False, tol, step):
            return None
        width = max((high - low).bit_length(), 1)
        return (low, width) if width <= 8 else None

    @staticmethod
    def of(t: torch.Tensor, tol: float, low: int, width: int) -> FixedCodes:
        """``t``'s codes as :meth:`plan` gave their ``low`` and ``width``."""
        x = t.detach().contiguous().reshape(-1)
        out = torch.empty(FixedCodes.size(x.numel(), width), dtype=torch.uint8)
        pack_fixed(x.numpy(), steps_for(tol)[1], low, width, out.numpy())
        return FixedCodes(out, tol, low, width, tuple(t.shape), t.dtype)

    def restore(self) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype)
        step = steps_for(self.tol)[0]
        unpack_fixed(self.payload.numpy(), self.width, self.low, step, out.reshape(-1).numpy())
        return out
