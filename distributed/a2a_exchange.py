"""One compressed all-to-all exchange of per-table blocks, with its header and checks.

A sender holds, for every destination rank, a list of ``[rows, dim]`` blocks (one
per table it sends there). Each block is compressed on its own under its table's
codec (``block`` with a resolved ``abs`` tolerance, ``quant`` with its bits, or
none: the raw bytes), as one chunk. The exchange takes two collectives:

1. ``all_gather`` of a fixed-size int64 header per rank: a status code, a
   fingerprint of the table layout and codecs, the input's dtype and shape, the
   batch split, and per (destination, table slot) the payload length and the
   resolved tolerance (float64 bits). Every rank sees every header, so every rank
   finds the same problem (a bad input on one rank, a mismatched layout) and raises
   the same error: no rank is left waiting in the second collective.
2. ``all_to_all_single`` of the uint8 payloads, split by the lengths just gathered,
   so every receiver allocates exactly what arrives.

Receivers rebuild a :class:`~tensorpress.compress.tensor.CompressedTensor` (their
own copy of the table's codec, the block's shape and dtype, the sent length and
tolerance) and decode it.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..compress.bounds import ErrorBound
from ..compress.codec import Codec
from ..compress.tensor import CompressedTensor, compress_tensor, decompress_tensor

__all__ = [
    "DTYPE_CODES",
    "ExchangeError",
    "ExchangeStats",
    "Header",
    "Plan",
    "exchange",
    "fingerprint",
]

#: dtypes an exchange carries, and their code in the header
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}
_DTYPES = {v: k for k, v in DTYPE_CODES.items()}

OK, BAD_INPUT, CODEC_FAILED = 0, 1, 2
_FIXED = 6  # status, fingerprint, dtype code, three shape dims


class ExchangeError(ValueError):
    """A problem found on some rank; every rank of the exchange raises it."""


@dataclass
class ExchangeStats:
    """What one direction of an all-to-all cost on this rank, summed over calls."""

    calls: int = 0
    #: compressed payload bytes sent to other ranks
    payload_bytes: int = 0
    #: header bytes sent to other ranks (a ring all_gather forwards world - 1 headers)
    header_bytes: int = 0
    #: bytes the blocks would take uncompressed in their own dtype, to other ranks
    raw_bytes: int = 0
    #: seconds spent compressing and decompressing
    codec_seconds: float = 0.0
    #: seconds spent in the two collectives
    comm_seconds: float = 0.0

    @property
    def bytes_sent(self) -> int:
        """Payload plus header bytes sent to other ranks."""
        return self.payload_bytes + self.header_bytes

    @property
    def ratio(self) -> float:
        """Uncompressed payload bytes per byte sent."""
        return self.raw_bytes / max(self.bytes_sent, 1)


def fingerprint(*parts) -> int:
    """A 31-bit checksum of the layout and codec configs (bounds left out) that every
    rank must share."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


@dataclass
class Header:
    """What one rank declares before the payloads move."""

    status: int
    fingerprint: int
    dtype: int
    shape: tuple
    batch_sizes: tuple
    lengths: list  # [world][slots] payload bytes
    tolerances: list  # [world][slots] resolved abs tolerance, NaN for unbounded codecs

    def pack(self, world: int, slots: int) -> torch.Tensor:
        head = torch.zeros(_FIXED + world + 2 * world * slots, dtype=torch.int64)
        shape = (list(self.shape) + [0, 0, 0])[:3]
        head[:_FIXED] = torch.tensor([self.status, self.fingerprint, self.dtype, *shape])
        head[_FIXED : _FIXED + world] = torch.tensor(self.batch_sizes, dtype=torch.int64)
        at = _FIXED + world
        lengths = torch.zeros(world, slots, dtype=torch.int64)
        tols = torch.full((world, slots), math.nan, dtype=torch.float64)
        for r in range(world):
            n = len(self.lengths[r])
            lengths[r, :n] = torch.tensor(self.lengths[r], dtype=torch.int64)
            tols[r, :n] = torch.tensor(self.tolerances[r], dtype=torch.float64)
        head[at : at + world * slots] = lengths.reshape(-1)
        head[at + world * slots :] = tols.view(torch.int64).reshape(-1)
        return head

    @classmethod
    def unpack(cls, head: torch.Tensor, world: int, slots: int) -> Header:
        fixed = head[:_FIXED].tolist()
        at = _FIXED + world
        lengths = head[at : at + world * slots].reshape(world, slots).tolist()
        tols = head[at + world * slots :].clone().view(torch.float64).reshape(world, slots)
        return cls(
            fixed[0],
            fixed[1],
            fixed[2],
            tuple(fixed[3:6]),
            tuple(head[_FIXED:at].tolist()),
            lengths,
            tols.tolist(),
        )


def _encode(block: torch.Tensor, codec: Codec | None, bound: ErrorBound | None):
    """(uint8 payload, tolerance) of one ``[rows, dim]`` block, as one chunk."""
    if codec is None:
        return block.contiguous().view(torch.uint8).reshape(-1), math.nan
    rows_bytes = max(1, block.numel() * block.element_size())
    if codec.bounded:
        if bound != codec.bound:
            codec = codec.with_bound(bound)
        ct = compress_tensor(block, codec, chunk_bytes=rows_bytes)
        return ct.payload, ct.bound.tolerance
    ct = compress_tensor(block, codec, chunk_bytes=rows_bytes)
    return ct.payload, math.nan


def _decode(payload, codec, tolerance, shape, dtype) -> torch.Tensor:
    """The ``[rows, dim]`` block of one received payload."""
    if codec is None:  # a copy: the slice may not start at a multiple of the itemsize
        return payload.clone().view(dtype).reshape(shape)
    if shape[0] == 0:
        return torch.zeros(shape, dtype=dtype, device=payload.device)
    bound = ErrorBound("abs", tolerance, tolerance) if codec.bounded else None
    ct = CompressedTensor(payload, (payload.numel(),), shape, dtype, codec, bound, shape[0])
    return decompress_tensor(ct)


def _check_headers(heads: list[Header], problem: str | None) -> None:
    """Raise the same :class:`ExchangeError` on every rank when any rank reported a problem
    (this rank's own ``problem`` first, with its details)."""
    if problem is not None:
        raise ExchangeError(problem)
    for r, h in enumerate(heads):
        if h.status == BAD_INPUT:
            raise ExchangeError(f"rank {r} gave an invalid input (see the error on rank {r})")
        if h.status == CODEC_FAILED:
            raise ExchangeError(f"rank {r} could not compress its blocks (see its error)")
    first = heads[0]
    for r, h in enumerate(heads):
        if h.fingerprint != first.fingerprint:
            raise ExchangeError(
                f"rank {r} has another table layout or codec config than rank 0: every rank "
                "must build the all-to-all with the same tables, dim and codecs"
            )
        if h.batch_sizes != first.batch_sizes or h.dtype != first.dtype:
            raise ExchangeError(
                f"rank {r} exchanges dtype {_DTYPES[h.dtype]} with batch sizes "
                f"{list(h.batch_sizes)}, rank 0 dtype {_DTYPES[first.dtype]} with "
                f"{list(first.batch_sizes)}: all ranks must agree"
            )


@dataclass
class Plan:
    """Who sends what in one exchange, as this rank sees it.

    ``send[r]``: ``(codec or None, bound or None)`` of each block sent to rank ``r``;
    ``recv[s]``: ``(rows, codecs)``, the codec of each block rank ``s`` sends here;
    ``slots``: the most blocks any rank sends any rank (the same on every rank).
    """

    send: list
    recv: list
    dim: int
    slots: int


def exchange(blocks, plan: Plan, header: Header, problem: str | None, stats, group=None):
    """Send ``blocks[r]`` (a list of ``[rows, dim]`` tensors) to every rank ``r`` and
    return what arrives: ``out[s]``, the list of blocks from rank ``s``.

    ``header`` comes filled except its lengths and tolerances; a ``problem`` (this
    rank's input is bad) is raised here, after the other ranks have heard of it.
    """
    world = dist.get_world_size(group)
    me = dist.get_rank(group)
    t0 = time.perf_counter()
    payloads, problem = _encode_all(blocks, plan, header, problem, world, me)
    t1 = time.perf_counter()
    heads = _gather_headers(header, world, plan.slots, group)
    _check_headers(heads, problem)
    in_splits = [sum(header.lengths[r]) for r in range(world)]
    out_splits = [sum(heads[s].lengths[me][: len(plan.recv[s][1])]) for s in range(world)]
    device = _device_of(blocks)
    flat = [p for per_rank in payloads for p in per_rank]
    send = torch.cat(flat) if flat else torch.zeros(0, dtype=torch.uint8, device=device)
    recv = torch.empty(sum(out_splits), dtype=torch.uint8, device=device)
    dist.all_to_all_single(recv, send, out_splits, in_splits, group=group)
    t2 = time.perf_counter()
    out = _decode_all(recv, heads, plan, me)
    t3 = time.perf_counter()
    stats.calls += 1
    stats.payload_bytes += sum(n for r, n in enumerate(in_splits) if r != me)
    stats.header_bytes += (world - 1) * 8 * (_FIXED + world + 2 * world * plan.slots)
    stats.raw_bytes += sum(
        b.numel() * b.element_size() for r in range(world) if r != me for b in blocks[r]
    )
    stats.codec_seconds += (t1 - t0) + (t3 - t2)
    stats.comm_seconds += t2 - t1
    return out


def _encode_all(blocks, plan, header, problem, world, me):
    """Payloads ``[world][blocks]``; fills the header's lengths and tolerances."""
    payloads = [[] for _ in range(world)]
    header.lengths = [[] for _ in range(world)]
    header.tolerances = [[] for _ in range(world)]
    if problem is not None:
        return payloads, problem
    try:
        for r in range(world):
            for block, (codec, bound) in zip(blocks[r], plan.send[r], strict=True):
                payload, tol = _encode(block, codec, bound)
                payloads[r].append(payload)
                header.lengths[r].append(payload.numel())
                header.tolerances[r].append(tol)
    except (ValueError, TypeError, RuntimeError) as exc:
        header.status = CODEC_FAILED
        header.lengths = [[] for _ in range(world)]
        header.tolerances = [[] for _ in range(world)]
        return [
            [] for _ in range(world)
        ], f"compressing all-to-all blocks failed on rank {me}: {exc}"
    return payloads, None


def _device_of(blocks) -> torch.device:
    for per_rank in blocks:
        if per_rank:
            return per_rank[0].device
    return torch.device("cpu")


def _gather_headers(header: Header, world: int, slots: int, group) -> list[Header]:
    """Every rank's header (NCCL gathers CUDA tensors, gloo CPU ones)."""
    packed = header.pack(world, slots)
    if dist.get_backend(group) == "nccl":
        packed = packed.to(torch.device("cuda", torch.cuda.current_device()))
    gathered = [torch.empty_like(packed) for _ in range(world)]
    dist.all_gather(gathered, packed, group=group)
    return [Header.unpack(g.cpu(), world, slots) for g in gathered]


def _decode_all(recv, heads, plan, me) -> list[list[torch.Tensor]]:
    dtype = _DTYPES[heads[me].dtype]
    out = []
    at = 0
    for s, (rows, codecs) in enumerate(plan.recv):
        blocks = []
        for j, codec in enumerate(codecs):
            n = heads[s].lengths[me][j]
            tol = heads[s].tolerances[me][j]
            blocks.append(_decode(recv[at : at + n], codec, tol, (rows, plan.dim), dtype))
            at += n
        out.append(blocks)
    return out
