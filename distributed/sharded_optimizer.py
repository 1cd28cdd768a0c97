"""A small ZeRO-style sharded optimizer: reduce-scatter gradients, step a shard, all-gather.

The model's parameters are viewed as one flat float32 vector of ``numel`` values,
zero-padded to ``world * shard_numel`` (``shard_numel = ceil(numel / world)``);
rank r owns elements ``[r * shard_numel, (r + 1) * shard_numel)``. One
:meth:`ShardedOptimizer.step`:

1. reduce-scatter of the flat gradient (mean over ranks) with
   ``all_to_all_single`` (gloo has it; its ``reduce_scatter`` is recent): each rank
   sends piece j of its gradient to rank j and sums what it receives, in rank
   order. With ``grad_bits`` each piece travels as uint8 group-quantized codes
   (:func:`.wire.quantize_rows`, groups of ``GRAD_GROUP``, nearest
   rounding) instead of float32;
2. the inner optimizer (``optimizer_factory([shard])``) steps this rank's float32
   master shard, so optimizer state is sharded too;
3. all-gather of the updated shards, in full precision or as quantized weight
   differences (:class:`.weight_diff.WeightDiffQuantizer`), copied back into the
   model's parameters.

Bytes are counted per rank as the payload it sends to the other ranks (as
:mod:`.comm_hooks` counts): ``world - 1`` gradient pieces (float32, or their
quantized wire bytes) and ``world - 1`` copies of its weight shard's payload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from .weight_diff import FP32_BYTES, WeightDiffQuantizer, shard_numel, world_and_rank
from .wire import BITS, dequantize_rows, quantize_rows

__all__ = ["GRAD_GROUP", "ShardedOptimizer"]

GRAD_GROUP = 128  # values per quantization group of a gradient piece


class ShardedOptimizer:
    """ZeRO-style data parallelism over ``params`` (all float32, same order on every rank).

    ``optimizer_factory``: called with ``[shard]`` (one flat float32 leaf tensor) to build
    the inner optimizer, e.g. ``lambda p: torch.optim.AdamW(p, lr=1e-3)``; it is
    available as :attr:`optimizer` (for learning-rate schedulers). ``weight_quantizer``:
    False for full-precision weight all-gathers, True for a default
    :class:`WeightDiffQuantizer`, or a dict of its keyword arguments. ``grad_bits``: None
    for float32 gradients, else 2, 4 or 8 bits per value in groups of ``GRAD_GROUP``.

    At construction rank 0's parameters are broadcast so all ranks start equal. Call
    ``loss.backward()`` on every rank, then :meth:`step`. Counters: ``steps``,
    ``grad_bytes`` and ``weight_bytes`` (bytes this rank sent to the other ranks),
    ``grad_full_bytes`` and ``weight_full_bytes`` (the float32 equivalents).
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        optimizer_factory: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
        process_group=None,
        weight_quantizer: bool | dict = False,
        grad_bits: int | None = None,
    ):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("params is empty: pass the model's parameters")
        bad = [tuple(p.shape) for p in self.params if p.dtype != torch.float32]
        if bad:
            raise ValueError(f"all parameters must be float32; got other dtypes for shapes {bad}")
        if grad_bits is not None and grad_bits not in BITS:
            raise ValueError(f"grad_bits must be None or one of {BITS}, got {grad_bits!r}")
        if not isinstance(weight_quantizer, bool | dict):
            raise TypeError(
                "weight_quantizer must be False, True or a dict of WeightDiffQuantizer "
                f"arguments, got {type(weight_quantizer).__name__}"
            )
        self.process_group, self.grad_bits = process_group, grad_bits
        self.world, self.rank = world_and_rank(process_group)
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = shard_numel(self.numel, self.world)
        self.quantizer: WeightDiffQuantizer | None = None
        if weight_quantizer is not False:
            kwargs = {} if weight_quantizer is True else dict(weight_quantizer)
            self.quantizer = WeightDiffQuantizer(self.numel, process_group, **kwargs)

        flat = self._flat([p.detach() for p in self.params])
        src = dist.get_global_rank(process_group, 0) if process_group is not None else 0
        dist.broadcast(flat, src=src, group=process_group)
        self._copy_to_params(flat)
        lo = self.rank * self.shard_numel
        self.shard = flat[lo : lo + self.shard_numel].clone().requires_grad_(True)
        self.optimizer = optimizer_factory([self.shard])
        self.steps = 0
        self.grad_bytes = self.weight_bytes = 0
        self.grad_full_bytes = self.weight_full_bytes = 0

    # ------------------------------------------------------------------ flat views

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """float32 ``[world * shard_numel]``: ``tensors`` concatenated, zero-padded."""
        out = torch.zeros(
            self.world * self.shard_numel, dtype=torch.float32, device=self.params[0].device
        )
        torch.cat([t.reshape(-1) for t in tensors], out=out[: self.numel])
        return out

    @torch.no_grad()
    def _copy_to_params(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

    # ------------------------------------------------------------------ the step

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """Reduce-scatter the gradients, step this rank's shard, all-gather the weights."""
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]
        self.shard.grad = self._reduce_scatter(self._flat(grads))
        self.optimizer.step()
        self._all_gather()
        self.steps += 1

    def _reduce_scatter(self, flat_grad: torch.Tensor) -> torch.Tensor:
        """This rank's shard of the mean of ``flat_grad`` over ranks (float32)."""
        m, world = self.shard_numel, self.world
        others = world - 1
        self.grad_full_bytes += others * FP32_BYTES * m
        if self.grad_bits is None:
            received = torch.empty_like(flat_grad)
            dist.all_to_all_single(received, flat_grad, group=self.process_group)
            self.grad_bytes += others * FP32_BYTES * m
            pieces = received.view(world, m)
        else:
            send = quantize_rows(flat_grad.view(world, m), bits=self.grad_bits, group=GRAD_GROUP)
            received = torch.empty_like(send)
            dist.all_to_all_single(received, send, group=self.process_group)
            self.grad_bytes += others * send.shape[1]
            pieces = dequantize_rows(received, m, self.grad_bits, GRAD_GROUP)
        total = pieces[0].clone()
        for piece in pieces[1:]:
            total += piece
        return total.div_(world)

    def _all_gather(self) -> None:
        self.weight_full_bytes += (self.world - 1) * FP32_BYTES * self.shard_numel
        if self.quantizer is not None:
            before = self.quantizer.bytes_sent
            lo, hi = self.quantizer.shard_range()
            full = self.quantizer.gather(self.shard.detach()[: hi - lo])
            self.weight_bytes += self.quantizer.bytes_sent - before
        else:
            full = torch.empty(self.world * self.shard_numel, device=self.shard.device)
            dist.all_gather(
                list(full.chunk(self.world)), self.shard.detach(), group=self.process_group
            )
            self.weight_bytes += (self.world - 1) * FP32_BYTES * self.shard_numel
        self._copy_to_params(full)
