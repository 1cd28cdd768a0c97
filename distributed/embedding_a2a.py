"""A compressed, autograd-aware all-to-all for table-wise sharded embeddings (DLRM).

Each rank owns some embedding tables (``tables_per_rank``; tables are numbered
rank 0's first) and pools their lookups for the whole global batch:
``[sum(batch_sizes), own tables, dim]``. The all-to-all hands every rank the
pooled values of all tables for its own part of the batch,
``[batch_sizes[rank], all tables, dim]``; backward sends the gradients the
opposite way. Each ``[rows, dim]`` block of one table for one destination is
compressed on its own under that table's codec for that direction: ``block``
with an ``abs`` or ``rel`` bound (``rel`` of the block's value range), ``quant``
for a bit budget, or None for the raw values; :class:`AdaptiveBounds` may
rescale the bounds per table and per step. See ``a2a_exchange`` for the wire.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..compress.codec import Codec
from ..compress.registry import get_codec
from .a2a_exchange import (
    BAD_INPUT,
    DTYPE_CODES,
    OK,
    ExchangeStats,
    Header,
    Plan,
    exchange,
    fingerprint,
)
from .adaptive_bounds import AdaptiveBounds

__all__ = ["EmbeddingAllToAll"]


def _table_codecs(spec, ntables: int, what: str) -> list[Codec | None]:
    """One codec (or None) per table from None, a codec or config, or a list of them."""
    specs = list(spec) if isinstance(spec, (list, tuple)) else [spec] * ntables
    if len(specs) != ntables:
        raise ValueError(f"{what} codecs: got {len(specs)} for {ntables} tables")
    out = []
    for t, s in enumerate(specs):
        if s is None:
            out.append(None)
            continue
        try:
            codec = s if isinstance(s, Codec) else get_codec(s)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{what} codec of table {t}: {exc}") from None
        if not codec.has_tensor_path or codec.stages:
            raise ValueError(f"{what} codec of table {t}: {codec!r} has no torch path")
        if codec.bounded and (codec.bound is None or codec.bound.mode == "pw_rel"):
            raise ValueError(
                f"{what} codec of table {t}: {codec.name!r} needs an abs or rel bound, "
                f"got {codec.get_config()}"
            )
        out.append(codec)
    return out


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pooled, a2a, batch_sizes):
        ctx.a2a, ctx.batch_sizes = a2a, batch_sizes
        return a2a._send_values(pooled, batch_sizes)

    @staticmethod
    def backward(ctx, grad):
        return ctx.a2a._send_grads(grad, ctx.batch_sizes), None, None


class EmbeddingAllToAll:
    """Pooled embeddings out, gradients back, each table's blocks compressed.

    ``tables_per_rank``: how many tables each rank owns (0 allowed); ``dim``: the
    embedding width of every table. ``forward`` / ``backward``: the codec for the
    values and for the gradients, as None (raw), one codec or config for all tables
    (``{"id": "block", "rel": 1e-2}``, ``{"id": "quant", "bits": 4}``) or a list with
    one per table. ``adaptive``: an :class:`AdaptiveBounds` that rescales bounded
    codecs' bounds per table and step. ``forward_stats`` / ``backward_stats`` count
    the bytes this rank sends and the seconds it spends compressing.

    Build and call it on every rank of ``group`` with the same arguments; every
    rank that calls it must run backward through it too (or none).
    """

    def __init__(self, tables_per_rank, dim: int, *, forward=None, backward=None,
                 adaptive: AdaptiveBounds | None = None, group=None):  # fmt: skip
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("EmbeddingAllToAll needs torch.distributed.init_process_group first")
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        counts = list(tables_per_rank)
        if len(counts) != self.world or any(
            isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts
        ):
            raise ValueError(
                f"tables_per_rank must list {self.world} counts >= 0, got {tables_per_rank!r}"
            )
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        self.dim = dim
        starts = [sum(counts[:r]) for r in range(self.world)]
        self.tables = [list(range(s, s + c)) for s, c in zip(starts, counts, strict=True)]
        self.ntables = sum(counts)
        self.forward_codecs = _table_codecs(forward, self.ntables, "forward")
        self.backward_codecs = _table_codecs(backward, self.ntables, "backward")
        if adaptive is not None and not isinstance(adaptive, AdaptiveBounds):
            raise ValueError(f"adaptive must be an AdaptiveBounds, got {type(adaptive).__name__}")
        if adaptive is not None and adaptive.ntables != self.ntables:
            raise ValueError(f"adaptive has {adaptive.ntables} tables, not {self.ntables}")
        self.adaptive = adaptive
        self.slots = max(counts, default=0)
        self._fingerprint = fingerprint(
            counts, dim, *[c and c.stream_config() for c in self.forward_codecs],
            *[c and c.stream_config() for c in self.backward_codecs],
        )  # fmt: skip
        self.forward_stats = ExchangeStats()
        self.backward_stats = ExchangeStats()

    def __call__(self, pooled: torch.Tensor, batch_sizes=None) -> torch.Tensor:
        """``[sum(batch_sizes), own tables, dim]`` in, ``[batch_sizes[rank], all tables,
        dim]`` out. ``batch_sizes``: rows of the global batch each rank keeps, the same
        on every rank (default: an equal split)."""
        if batch_sizes is None:
            rows = pooled.shape[0] if isinstance(pooled, torch.Tensor) and pooled.dim() else 0
            batch_sizes = (rows // self.world,) * self.world if rows % self.world == 0 else None
            if batch_sizes is None:  # reported through the exchange, so no rank waits
                batch_sizes = (-1,) * self.world
        return _Exchange.apply(pooled, self, tuple(int(b) for b in batch_sizes))

    def reset_stats(self) -> None:
        self.forward_stats = ExchangeStats()
        self.backward_stats = ExchangeStats()

    # -- the two directions --------------------------------------------------------

    def _problem(self, x, batch_sizes, expected) -> str | None:
        """What is wrong with this rank's input, or None."""
        if len(batch_sizes) != self.world or any(b < 0 for b in batch_sizes):
            return (
                f"rank {self.rank}: batch_sizes must hold {self.world} counts >= 0 that split "
                f"the global batch, got {list(batch_sizes)} (the default split needs the batch "
                f"to divide by {self.world})"
            )
        if not isinstance(x, torch.Tensor) or x.dtype not in DTYPE_CODES:
            got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            return f"rank {self.rank}: the all-to-all takes a float tensor, got {got}"
        if tuple(x.shape) != expected:
            return f"rank {self.rank}: expected a tensor of shape {expected}, got {tuple(x.shape)}"
        return None

    def _header(self, x, batch_sizes, problem) -> Header:
        ok = problem is None
        shape = tuple(x.shape) if ok else (0, 0, 0)
        dtype = DTYPE_CODES[x.dtype] if ok else 0
        sizes = batch_sizes if len(batch_sizes) == self.world else (-1,) * self.world
        return Header(OK if ok else BAD_INPUT, self._fingerprint, dtype, shape, sizes, [], [])

    def _send(self, codecs, direction, table):
        codec = codecs[table]
        if codec is None or not codec.bounded:
            return codec, None
        bound = codec.bound
        if self.adaptive is not None:
            bound = self.adaptive.bound(direction, table, bound)
        return codec, bound

    def _send_values(self, pooled, batch_sizes) -> torch.Tensor:
        mine = self.tables[self.rank]
        expected = (sum(batch_sizes), len(mine), self.dim)
        problem = self._problem(pooled, batch_sizes, expected)
        header = self._header(pooled, batch_sizes, problem)
        blocks = [[] for _ in range(self.world)]
        if problem is None:
            pooled = pooled.detach()
            if self.adaptive is not None:
                self.adaptive.observe("forward", mine, pooled)
            at = 0
            for r, b in enumerate(batch_sizes):
                blocks[r] = [pooled[at : at + b, j] for j in range(len(mine))]
                at += b
        me_rows = batch_sizes[self.rank] if problem is None else 0
        plan = Plan(
            send=[[self._send(self.forward_codecs, "forward", t) for t in mine]] * self.world,
            recv=[(me_rows, [self.forward_codecs[t] for t in ts]) for ts in self.tables],
            dim=self.dim,
            slots=self.slots,
        )
        out = exchange(blocks, plan, header, problem, self.forward_stats, self.group)
        flat = [b for per_rank in out for b in per_rank]
        if not flat:
            return pooled.new_zeros((me_rows, 0, self.dim))
        return torch.stack(flat, dim=1)

    def _send_grads(self, grad, batch_sizes) -> torch.Tensor:
        mine = self.tables[self.rank]
        expected = (batch_sizes[self.rank], self.ntables, self.dim)
        problem = self._problem(grad, batch_sizes, expected)
        header = self._header(grad, batch_sizes, problem)
        blocks = [[] for _ in range(self.world)]
        if problem is None:
            if self.adaptive is not None:
                self.adaptive.observe("backward", range(self.ntables), grad)
            blocks = [[grad[:, t] for t in ts] for ts in self.tables]
        plan = Plan(
            send=[[self._send(self.backward_codecs, "backward", t) for t in ts]
                  for ts in self.tables],
            recv=[(b, [self.backward_codecs[t] for t in mine]) for b in batch_sizes],
            dim=self.dim,
            slots=self.slots,
        )  # fmt: skip
        out = exchange(blocks, plan, header, problem, self.backward_stats, self.group)
        if not mine:
            return grad.new_zeros((sum(batch_sizes), 0, self.dim))
        per_table = [torch.cat([out[r][j] for r in range(self.world)]) for j in range(len(mine))]
        return torch.stack(per_table, dim=1)
