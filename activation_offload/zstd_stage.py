"""A lossless second stage for codec payloads in host memory: zstd.

The ``block`` codec packs each block of 64 codes at one fixed bit width. The codes
of activations still hold what an entropy coder takes over a fixed width, and rows
that repeat (one token's activations wherever it occurs, say) repeat their bytes:
zstd at a low level takes both, at a speed a training step can afford
(``benchmarks/activations.py``, the byte-level LM).

``ZstdStage`` keeps zstd to the kinds of tensor it pays for: a small CNN's ReLU
outputs, whose payloads the codec's sparse packings already hold tightly, save little
and pay its time (the same benchmark's CNN).

A payload is cut into pieces of about ``PIECE_BYTES`` that the shared worker threads
compress and restore at the same time; each frame carries a checksum of its bytes, so
a damaged piece raises instead of restoring wrong codes. A piece zstd cannot shrink by
1/16 is held as it is. Payloads on a GPU are left alone: their bytes never leave the
device to be compressed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from .._util.threads import map_ordered
from ..compress.tensor import CompressedTensor
from ..compress.zstd import zstd_compress, zstd_decompress

PIECE_BYTES = 1 << 18  # payload bytes per zstd frame (about 1.5 MiB of float32 input)
#: zstd stays on for a kind of tensor while it saves this share of bytes: at level 1 it
#: takes about 4 ns of CPU a byte it reads (both ways), so a third holds it to about 12 ns
#: a byte saved, what fixed-width codes hold the codec's packings to (``codec.py``,
#: FIXED_MIN_GAIN; ``benchmarks/activations.py``, the ViTs)
MIN_SAVING = 1 / 3
RETRY_AFTER = 32  # a kind it did not pay for is tried again after this many tensors
MAX_KINDS = 4096  # kinds remembered (shapes that vary from step to step add kinds)


class ZstdStage:
    """zstd at ``level`` for the payloads of the kinds of tensor it pays for.

    A kind (say, one module's saved tensors of one shape) on whose last payload zstd
    saved less than ``MIN_SAVING`` of the bytes is held without it for its next
    ``RETRY_AFTER`` tensors, then tried again.
    """

    def __init__(self, level: int):
        self.level = level
        self._skips: dict = {}  # kind -> tensors held without zstd since it last failed

    def skip(self, kind) -> bool:
        """Whether the next payload of ``kind`` goes without zstd (it did not pay for the
        kind's last one); counts it as one of the ``RETRY_AFTER`` so held."""
        skips = self._skips.get(kind)
        if skips is not None and skips < RETRY_AFTER:
            self._skips[kind] = skips + 1
            return True
        return False

    def squeeze(self, ct: CompressedTensor, kind) -> CompressedTensor | Squeezed:
        """``ct`` through zstd, or ``ct`` itself where the stage skips ``kind``."""
        return ct if self.skip(kind) else self.squeeze_now(ct, kind)

    def squeeze_now(self, ct: CompressedTensor, kind) -> CompressedTensor | Squeezed:
        """``ct`` through zstd (its saving decides whether ``kind`` is skipped next)."""
        sq = squeeze(ct, self.level)
        if sq.nbytes > (1 - MIN_SAVING) * ct.nbytes:
            if len(self._skips) >= MAX_KINDS:
                self._skips.clear()
            self._skips[kind] = 0
        else:
            self._skips.pop(kind, None)
        return sq


@dataclass(frozen=True)
class Squeezed:
    """A :class:`CompressedTensor` whose payload went through zstd.

    ``payload``: the pieces one after another (uint8, CPU); ``sizes``: bytes of each
    piece as held; ``raw_sizes``: bytes of each before zstd (a piece whose two sizes
    are equal is held as it is); ``inner``: the compressed tensor, without payload.
    """

    payload: torch.Tensor
    sizes: tuple
    raw_sizes: tuple
    inner: CompressedTensor

    @property
    def nbytes(self) -> int:
        return int(self.payload.numel())


def squeeze(ct: CompressedTensor, level: int) -> CompressedTensor | Squeezed:
    """``ct`` with its payload through zstd at ``level``; ``ct`` itself when its payload
    is on a GPU or zstd shrinks none of it."""
    raw = ct.payload
    if raw.device.type != "cpu" or raw.numel() == 0:
        return ct
    buf = raw.numpy()
    n = buf.size
    pieces = -(-n // PIECE_BYTES)
    edges = [n * i // pieces for i in range(pieces + 1)]
    spans = list(zip(edges[:-1], edges[1:], strict=True))

    def one(span) -> bytes | np.ndarray:
        a, b = span
        frame = zstd_compress(buf[a:b], level, checksum=True)
        # strictly shorter, so that a piece held as it is tells itself apart by its size
        return frame if len(frame) <= (b - a) - max((b - a) >> 4, 1) else buf[a:b]

    parts = map_ordered(one, spans, torch.get_num_threads())
    sizes = tuple(len(p) for p in parts)
    if sizes == tuple(b - a for a, b in spans):
        return ct
    held = torch.empty(sum(sizes), dtype=torch.uint8)
    np.concatenate([np.frombuffer(p, np.uint8) for p in parts], out=held.numpy())
    return Squeezed(held, sizes, tuple(b - a for a, b in spans), replace(ct, payload=None))


def unsqueeze(sq: CompressedTensor | Squeezed) -> CompressedTensor:
    """The compressed tensor :func:`squeeze` took (``sq`` itself if it is one)."""
    if isinstance(sq, CompressedTensor):
        return sq
    held = sq.payload.numpy()
    if held.size != sum(sq.sizes):
        raise ValueError(f"zstd stage: {held.size} bytes held, the pieces need {sum(sq.sizes)}")
    out = torch.empty(sum(sq.raw_sizes), dtype=torch.uint8)
    dst = out.numpy()
    src = np.concatenate([[0], np.cumsum(sq.sizes)]).tolist()
    dst_at = np.concatenate([[0], np.cumsum(sq.raw_sizes)]).tolist()

    def one(i: int) -> None:
        piece = held[src[i] : src[i + 1]]
        want = sq.raw_sizes[i]
        if sq.sizes[i] == want:
            dst[dst_at[i] : dst_at[i + 1]] = piece
            return
        try:
            got = zstd_decompress(piece, want)
        except ValueError as exc:
            raise ValueError(f"zstd stage: piece {i}: {exc}") from None
        if len(got) != want:
            raise ValueError(f"zstd stage: piece {i} restored {len(got)} bytes, expected {want}")
        dst[dst_at[i] : dst_at[i + 1]] = np.frombuffer(got, np.uint8)

    map_ordered(one, range(len(sq.sizes)), torch.get_num_threads())
    return replace(sq.inner, payload=out)
