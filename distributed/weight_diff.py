"""Quantized weight differences (qWD, SDP4Bit) for sharded data parallelism.

In ZeRO-style training every rank updates one shard of the flat float32 weights
and all ranks then all-gather the shards to rebuild the full model. qWD sends,
instead of the new shard, the difference between it and the previous step's
*reconstructed* weights of that shard, quantized to ``bits`` bits in groups of
``group`` values (:func:`.wire.quantize_groups`). Every rank, the owner
included, rebuilds ``weights = previous + dequantize(diff)`` from the same wire
bytes, so all ranks hold bit-identical weights, and the quantization error of
one step is part of the next step's difference (error feedback by
construction). At step 0 and every ``refresh_every`` steps the shards go out in
full precision and the reconstruction is exact.

Sharding: the flat vector of ``numel`` values is zero-padded to ``world *
shard_numel`` with ``shard_numel = ceil(numel / world)``; rank r owns
``[r * shard_numel, (r + 1) * shard_numel)`` clipped to ``numel``.

Bytes are counted per rank as the payload it sends to the other ranks (as
:mod:`.comm_hooks` counts): its shard goes to ``world - 1`` ranks, so a step
costs ``(world - 1) * wire_nbytes(shard_numel, bits, group)`` quantized and
``(world - 1) * 4 * shard_numel`` in full precision.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .wire import (
    BITS,
    GroupQuantized,
    dequantize_groups,
    quantize_groups,
    wire_nbytes,
)

__all__ = ["WeightDiffQuantizer", "shard_numel", "world_and_rank"]

FP32_BYTES = 4
DEFAULT_REFRESH_EVERY = 100


def shard_numel(numel: int, world: int) -> int:
    """Elements per shard when ``numel`` elements are split over ``world`` ranks (padded)."""
    return -(-numel // world)


def world_and_rank(process_group) -> tuple[int, int]:
    """(world size, rank) in ``process_group``; RuntimeError if torch.distributed is not up."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "torch.distributed is not initialized: call "
            "torch.distributed.init_process_group(...) before building this object"
        )
    return dist.get_world_size(process_group), dist.get_rank(process_group)


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


class WeightDiffQuantizer:
    """All-gathers weight shards as quantized differences; every rank keeps the full weights.

    ``numel``: elements of the flat float32 weight vector; ``bits``: 2, 4 or 8 bits per
    difference value; ``group``: values per quantization group (each group sends a
    float32 ``lo`` and ``scale``); ``refresh_every``: a full-precision gather every this
    many steps (1: always; None: only at step 0); ``stochastic``: stochastic instead of
    round-to-nearest rounding (then the error per value is below ``scale`` instead of
    ``scale / 2``).

    Counters: ``steps`` (gathers done), ``bytes_sent`` (bytes this rank sent to the other
    ranks), ``full_precision_bytes`` (what float32 shards would have cost).
    """

    def __init__(
        self,
        numel: int,
        process_group=None,
        bits: int = 4,
        group: int = 2048,
        refresh_every: int | None = DEFAULT_REFRESH_EVERY,
        stochastic: bool = False,
    ):
        _check_int("numel", numel, 1)
        if bits not in BITS:
            raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
        _check_int("group", group, 1)
        if refresh_every is not None:
            _check_int("refresh_every (or None for never after step 0)", refresh_every, 1)
        self.numel, self.bits, self.group = numel, bits, group
        self.refresh_every, self.stochastic = refresh_every, bool(stochastic)
        self.process_group = process_group
        self.world, self.rank = world_and_rank(process_group)
        self.shard_numel = shard_numel(numel, self.world)
        self.wire_nbytes = wire_nbytes(self.shard_numel, bits, group)
        self._weights: torch.Tensor | None = None  # float32 [world * shard_numel]
        self.steps = 0
        self.bytes_sent = 0
        self.full_precision_bytes = 0

    def shard_range(self, rank: int | None = None) -> tuple[int, int]:
        """``(start, stop)`` element range of ``rank``'s shard (this rank by default)."""
        r = self.rank if rank is None else rank
        start = min(r * self.shard_numel, self.numel)
        return start, min(start + self.shard_numel, self.numel)

    @property
    def weights(self) -> torch.Tensor | None:
        """The reconstructed flat weights (float32 ``[numel]``, shared; do not modify), or
        None before the first :meth:`gather`."""
        return None if self._weights is None else self._weights[: self.numel]

    def is_refresh_step(self) -> bool:
        """Whether the next :meth:`gather` sends full precision."""
        if self._weights is None or self.steps == 0:
            return True
        return self.refresh_every is not None and self.steps % self.refresh_every == 0

    @torch.no_grad()
    def gather(self, shard: torch.Tensor) -> torch.Tensor:
        """All-gather this rank's updated ``shard`` (float, ``stop - start`` elements of
        :meth:`shard_range`); returns the reconstructed full weights (see :attr:`weights`)."""
        start, stop = self.shard_range()
        if shard.dim() != 1 or shard.numel() != stop - start:
            raise ValueError(
                f"shard must be a 1-D tensor of {stop - start} elements (rank {self.rank}'s "
                f"range [{start}, {stop}) of {self.numel}), got shape {tuple(shard.shape)}"
            )
        if not shard.is_floating_point():
            raise TypeError(f"shard must be a floating tensor, got {shard.dtype}")
        padded = torch.zeros(self.shard_numel, dtype=torch.float32, device=shard.device)
        padded[: stop - start] = shard.detach()
        if self.is_refresh_step():
            self._gather_full(padded)
        else:
            self._gather_diff(padded)
        self.steps += 1
        self.full_precision_bytes += (self.world - 1) * FP32_BYTES * self.shard_numel
        return self.weights

    def _gather_full(self, padded: torch.Tensor) -> None:
        out = torch.empty(self.world * self.shard_numel, dtype=torch.float32, device=padded.device)
        dist.all_gather(list(out.chunk(self.world)), padded, group=self.process_group)
        self._weights = out
        self.bytes_sent += (self.world - 1) * FP32_BYTES * self.shard_numel

    def _gather_diff(self, padded: torch.Tensor) -> None:
        weights, m = self._weights, self.shard_numel
        lo = self.rank * m
        diff = padded - weights[lo : lo + m]
        q = quantize_groups(
            diff,
            bits=self.bits,
            group=self.group,
            stochastic=self.stochastic,
            seed=(self.steps * self.world + self.rank) % 2**31,
        )
        wire = q.to_wire()
        bufs = [torch.empty_like(wire) for _ in range(self.world)]
        dist.all_gather(bufs, wire, group=self.process_group)
        for r, buf in enumerate(bufs):  # the owner too: every rank rebuilds from the wire
            q_r = GroupQuantized.from_wire(buf, m, self.bits, self.group)
            weights[r * m : (r + 1) * m] += dequantize_groups(q_r).to(weights.device)
        weights[self.numel :] = 0  # the padding stays exact, so its differences stay 0
        self.bytes_sent += (self.world - 1) * self.wire_nbytes
