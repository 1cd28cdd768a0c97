"""The codec side of activation compression: one registered codec, used on saved tensors.

``ActivationCodec`` turns a saved tensor into a payload and back. What it may do is read
from the codec's declared class attributes (``lossy``, ``bounded``, ``has_tensor_path``,
``dtypes``), never from its name: a codec with a torch tensor path compresses on the
tensor's own device (``compress_tensor``); one without goes through the host and the
container (``tensorpress.formats``). ``PackedCodes`` stand in for the ``block`` codec's
payload where a fixed width of 7 bits or more holds its codes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..compress import ErrorBound, compress_tensor, decompress_tensor, get_codec
from ..compress.block import BlockCodec, steps_for
from ..compress.block.kernels.encode import check_free_codes
from ..compress.block.stochastic import derive_seed
from ..compress.kernels.rounding import PREC_FLOAT32, PREC_FLOAT64
from ..formats import decode_array, encode_array
from .kernels import pack_codes, unpack_codes
from .zstd_stage import ZstdStage, unsqueeze

#: steps a tensor's range spans from which it is held in fixed-width codes (7 bits or more)
CODES_MIN_STEPS = 64
#: the same for a record parked in a store with a file tier (6 bits or more) whose kind
#: the zstd stage is not taking: there the bytes go to disk and the codec's time is what
#: the step pays, so a single pass wins from fewer steps on (see benchmarks/offload.py,
#: run (e))
CODES_MIN_STEPS_SPILLED = 32
#: the widest fixed-width code (the kernels pack up to 16): past 8 bits the codec's
#: difference packings hold smooth tensors in far fewer bytes than one width does
MAX_WIDTH = 8


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
        # fixed-width codes restore what BlockCodec restores (same step, same rounding)
        self.packed_codes = isinstance(codec, BlockCodec) and not codec.stochastic
        self.zstd = None if zstd is None else ZstdStage(zstd)
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
        ValueRange where fixed-width codes may hold it (abs); ``held``: where the payload
        goes. In "memory" fixed-width codes take it from ``CODES_MIN_STEPS`` steps; in
        "files" (a store's) from ``CODES_MIN_STEPS_SPILLED`` unless the zstd stage is taking
        its kind (fixed-width codes skip that stage); in "pool" (a store without files,
        whose host pool is its budget) never."""
        skipped = False  # the zstd stage has counted this payload as one it skips
        if self.packed_codes and mode == "abs" and span is not None and held != "pool":
            steps = CODES_MIN_STEPS
            if held == "files":
                skipped = self.zstd is not None and self.zstd.skip(kind)
                steps = CODES_MIN_STEPS_SPILLED if self.zstd is None or skipped else steps
            codes = PackedCodes.of(t, tol, span, steps)
            if codes is not None:
                return codes, codes.nbytes
        bound = {mode: tol} if self.bounded else {}
        if not self.on_device:
            blob = self._host_stream(t, bound)
            return blob, len(blob)
        ct = compress_tensor(t, self.name, **bound, **self._params())
        if self.zstd is not None and not skipped:
            ct = self.zstd.squeeze(ct, kind)
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
        if isinstance(payload, PackedCodes):
            return payload.restore()
        if isinstance(payload, bytes):  # a host stream
            arr = decode_array(payload)
            if not arr.flags.writeable:  # a view of the stream's bytes
                arr = arr.copy()
            return torch.from_numpy(arr).to(device)
        return decompress_tensor(unsqueeze(payload))


@dataclass(frozen=True)
class PackedCodes:
    """A CPU tensor held as fixed-width codes under an absolute bound: ``q - low`` at
    ``width`` bits each, ``q = rint(x / step)`` and ``low`` the least code.

    Where a tensor's codes need 7 or 8 bits (its range spans 64 to 255 steps of twice
    the bound), a fixed width is at most about a sixth more than the ``block`` codec's
    packings hold, and a single pass writes it, at about half the codec's time
    (``benchmarks/activations.py``). Records bound for a store's files take them from
    32 steps (6 bits; see ``CODES_MIN_STEPS_SPILLED``). The values restored are the
    ``block`` codec's (same step, same rounding); every code lies within the codes the
    block quantizer is proven to restore within the bound unchecked
    (``check_free_codes``).
    """

    payload: torch.Tensor  # uint8, flat: 8 codes in ``width`` bytes, then 16 spare bytes
    tol: float  # the absolute bound the codes were made for
    low: int  # the least code
    width: int  # bits a code
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
    def of(t: torch.Tensor, tol: float, span, min_steps: int = CODES_MIN_STEPS):
        """``t``'s codes within ``tol`` (``span``: its ValueRange), or None where its range
        spans fewer than ``min_steps`` steps, a code needs more than ``MAX_WIDTH`` bits or
        lies past the proven ones, or ``t`` is not a float32/64 CPU tensor."""
        if t.device.type != "cpu" or t.dtype not in (torch.float32, torch.float64):
            return None
        lo, hi = span.ends
        step, inv = steps_for(tol)
        if not (tol > 0 and (hi - lo) * inv >= min_steps and math.isfinite(hi - lo)):
            return None  # (NaN and infinities fail here too)
        low, top = int(np.rint(lo * inv)), int(np.rint(hi * inv))
        prec = PREC_FLOAT32 if t.dtype == torch.float32 else PREC_FLOAT64
        limit = check_free_codes(prec, False, tol, step)
        width = max((top - low).bit_length(), 1)
        if width > MAX_WIDTH or max(-low, top) > limit:
            return None
        x = t.detach().contiguous().reshape(-1).numpy()
        out = torch.empty((x.size * width + 7) // 8 + 16, dtype=torch.uint8)
        if not pack_codes(x, inv, low, width, limit, out.numpy()):
            return None
        return PackedCodes(out, tol, low, width, tuple(t.shape), t.dtype)

    def restore(self) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype)
        unpack_codes(self.payload.numpy(), self.width, self.low, self.step, out.reshape(-1).numpy())
        return out
