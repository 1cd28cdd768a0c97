"""DDP communication hook: a quantized all-reduce (SDP4Bit's two-level TLq-HS).

Usage::

    state = QuantizedAllReduceState(bits=4, intra_bits=8, ranks_per_node=8)
    ddp_model.register_comm_hook(state, quantized_allreduce_hook)

A bucket of ``n`` gradients (DDP does not pre-divide) becomes their average over
the ``W`` ranks of the process group, computed as a quantized reduce-scatter
followed by a quantized all-gather. Every payload is a uint8 buffer of
:mod:`.wire` rows (groups of ``group`` values, float32 ``lo``/``scale`` per
group), moved with ``all_to_all_single`` and ``all_gather``, which gloo and
NCCL both support; arithmetic is float32 whatever the bucket dtype.

Layout: ``L`` ranks per node, ``N = W / L`` nodes, rank ``r = node * L + local``
(consecutive ranks share a node, as torchrun numbers them). The bucket is
zero-padded to ``W * s`` values, ``s = group * ceil(n / (W * group))`` (shards
divide evenly, whatever ``n``: there is no unquantized fallback) and viewed as
``[L, N, s]``; rank ``(node, local)`` ends up owning shard ``[local, node]``.

1. Intra-node (only when ``1 < L < W``): chunk ``i`` (``N * s`` values) is
   quantized at ``intra_bits`` and sent to local rank ``i`` with
   ``all_to_all_single`` among the node's ranks; each sums what it receives (the
   node's sum of its chunk).
2. Inter-node: the rank's chunk (with one level: its whole padded bucket) is
   split into ``N`` shards of ``s`` values, quantized at ``bits`` and exchanged
   with ``all_to_all_single`` among the ranks of the same local index (one
   level: all ranks); the received shards are summed and divided by ``W``.
3. All-gather: the averaged shard is quantized at ``bits`` and gathered from all
   ``W`` ranks; every rank dequantizes the same bytes, so replicas stay equal.

One level (``ranks_per_node`` None, 1 or ``W``) skips stage 1: stages 2 and 3 run
at ``bits`` over the whole group. Error feedback (per bucket, keyed by the bucket
index and reset when DDP rebuilds its buckets) keeps, for the next step, every
quantization error this rank makes: stage 1's error on its own contribution,
stage 2's error on the chunk it quantizes, and stage 3's error on the shard it
owns. Each is added back before the same stage next step, so the errors
telescope: the running sum of the hook's outputs stays within one step's error
of the running sum of exact averages, however many steps run.

Sizes: :func:`quantized_allreduce` first all-gathers each rank's value count (8
bytes; overlapped with the first quantization) and raises ValueError on every rank
unless all are equal; without this check gloo aborts the process (SIGABRT) on
collectives of unequal sizes, as it does for a plain ``all_reduce``. The hook checks
a bucket's first call only (DDP builds the same buckets on every rank), so its
steady state costs no extra collective.

Non-finite values (NaN, +-Inf, e.g. the overflow steps of AMP's GradScaler) come
back exactly where plain all-reduce has them: NaN where any rank has NaN or ranks
have +Inf and -Inf, else +-Inf where any rank has it. No stage quantizes them: a
stage whose group scales are not all finite (the common case costs one check per
group; on CUDA a host read per stage) replaces each non-finite value by the midpoint
of its group's finite values, so the group's scale is that of its finite values and
the rest of the group stays within the usual bound; a group whose finite range
overflows float32 (values of ``|x|`` above about 1.7e38, or 1.3e36 under Hadamard
with groups of 128) goes out as zeros and comes back as NaN. Each all-gathered row
carries one flag byte saying whether its rank left values out; in such a (rare)
step, the ranks all-reduce float32 ``W * s`` values holding the left-out values, 0
elsewhere, whose non-finite sums are the output there, and the error-feedback
residuals of every stage are zeroed there (finite positions keep theirs), so the
next steps are those of plain DDP after a skipped step plus the usual quantization
error.

Bytes sent by one rank for a bucket of ``n`` values (payload addressed to other
ranks; :func:`hook_wire_nbytes`, with ``B(m, b) = wire.wire_nbytes(m, b,
group)``)::

    (L - 1) * B(N * s, intra_bits) [if L > 1] + (N - 1) * B(s, bits) + (W - 1) * B(s, bits)
    + (W - 1) * 1  [flag bytes]

plus ``(W - 1) * 8`` bytes in a call that checks sizes, and, in a step where some
rank has non-finite values, a float32 ring all-reduce of ``W * s`` values
(:func:`ring_allreduce_nbytes`); ``bytes_sent`` counts all of it.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .wire import (
    BITS,
    check_args,
    dequantize_rows,
    quantize_rows_scaled,
    row_scales,
    wire_nbytes,
)

_SIZE_BYTES = 8  # int64 value count per rank, all-gathered before anything else
_FLAG_BYTES = 1  # after each all-gathered row: 1 if its rank left non-finite values out


def _check_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    return v


def _check_bits(name: str, v) -> int:
    if _check_int(name, v) not in BITS:
        raise ValueError(f"{name} must be 2, 4 or 8, got {v!r}")
    return v


def _levels(world_size: int, ranks_per_node) -> tuple[int, int]:
    """(ranks per node L, nodes N): L == 1 means one level over all ranks."""
    if _check_int("world_size", world_size) < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size!r}")
    if ranks_per_node is None:
        return 1, world_size
    if _check_int("ranks_per_node", ranks_per_node) < 1:
        raise ValueError(f"ranks_per_node must be a positive integer, got {ranks_per_node!r}")
    if world_size % ranks_per_node:
        raise ValueError(
            f"world size {world_size} is not divisible by ranks_per_node={ranks_per_node}: "
            "pass the number of ranks on each node, or None for one level"
        )
    if ranks_per_node == world_size:
        return 1, world_size
    return ranks_per_node, world_size // ranks_per_node


def shard_size(n: int, world_size: int, group: int) -> int:
    """Values per shard for an ``n``-value bucket: ``group * ceil(n / (world_size * group))``."""
    return group * -(-n // (world_size * group))


def hook_wire_nbytes(n, world_size, ranks_per_node=None, bits=4, intra_bits=8, group=128) -> int:
    """Bytes one rank sends to other ranks to all-reduce an ``n``-value bucket of finite
    values (module docstring formula)."""
    _check_bits("bits", bits)
    _check_bits("intra_bits", intra_bits)
    L, N = _levels(world_size, ranks_per_node)
    s = shard_size(n, world_size, group)
    total = (N - 1 + world_size - 1) * wire_nbytes(s, bits, group)
    total += (world_size - 1) * _FLAG_BYTES
    if L > 1:
        total += (L - 1) * wire_nbytes(N * s, intra_bits, group)
    return total


def ring_allreduce_nbytes(n: int, world_size: int, itemsize: int = 4) -> int:
    """Bytes one rank sends in a ring all-reduce of ``n`` values of ``itemsize`` bytes
    (the uncompressed reference: reduce-scatter plus all-gather)."""
    return 2 * (world_size - 1) * -(-n // world_size) * itemsize


class QuantizedAllReduceState:
    """Configuration, subgroups, error-feedback residuals and byte counters of the hook.

    Construct it on every rank after ``init_process_group`` (it creates the
    intra- and inter-node subgroups, a collective call). ``bits`` and
    ``intra_bits`` are 2, 4 or 8; ``group`` values share a float32 min and scale
    (a power of two with ``hadamard``); ``seed`` keys the Hadamard signs (the
    same on all ranks) and the stochastic rounding noise (offset by rank).
    ``record_error_bound`` makes every call also store
    :attr:`last_error_bound` (float32, one value per bucket value), composed from
    the scales each stage used: half a scale per value and stage with round to
    nearest, a whole one with stochastic rounding. It bounds ``|output - exact
    average|`` when ``error_feedback`` is off (else the average of the inputs
    plus residuals); with feedback, the latest call's bound also bounds ``|running
    sum of outputs - running sum of exact averages|`` since the bucket's first
    call. It costs one extra float32 all-reduce per call.

    Counters: :attr:`bytes_sent` (bytes this rank sent to other ranks),
    :attr:`calls` (buckets reduced), :attr:`steps` (backward passes, counted at
    the last bucket), :attr:`size_checks` (cross-rank size checks, 8 bytes to
    each other rank apiece); :meth:`reset_counters` zeroes them.
    :attr:`residual_keys` names the buckets that hold error-feedback residuals.
    """

    def __init__(
        self,
        process_group=None,
        bits: int = 4,
        intra_bits: int = 8,
        ranks_per_node: int | None = None,
        hadamard: bool = True,
        error_feedback: bool = True,
        group: int = 128,
        stochastic: bool = False,
        seed: int = 0,
        record_error_bound: bool = False,
    ):
        self._config = {
            "bits": _check_bits("bits", bits),
            "intra_bits": _check_bits("intra_bits", intra_bits),
            "ranks_per_node": ranks_per_node,
            "hadamard": hadamard,
            "error_feedback": error_feedback,
            "group": group,
            "stochastic": stochastic,
            "seed": seed,
            "record_error_bound": record_error_bound,
        }
        for name in ("hadamard", "error_feedback", "stochastic", "record_error_bound"):
            if not isinstance(self._config[name], bool):
                raise ValueError(f"{name} must be true or false, got {self._config[name]!r}")
        check_args(bits, group, hadamard, seed)
        if not dist.is_initialized():
            raise ValueError("call torch.distributed.init_process_group before creating the state")
        self.__dict__.update(self._config)
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.ranks_per_node, self.nodes = _levels(self.world_size, ranks_per_node)
        self.node, self.local_rank = divmod(self.rank, self.ranks_per_node)
        self.intra_group, self.inter_group = self._subgroups()
        self.last_error_bound = None
        self._residuals = {}
        self._sizes_checked = {}  # bucket index -> signature whose sizes the hook checked
        self._generators = {}
        self.reset_counters()

    def _subgroups(self):
        """(intra-node group, inter-node group) of this rank; (None, process group) for one
        level."""
        L, N = self.ranks_per_node, self.nodes
        if L == 1:
            return None, self.process_group
        pg = self.process_group
        default = pg is None or pg == dist.GroupMember.WORLD
        ranks = dist.get_process_group_ranks(pg if pg is not None else dist.GroupMember.WORLD)
        if ranks != sorted(ranks):
            raise ValueError(
                "ranks_per_node needs a process group whose ranks increase with the group "
                "rank (create it with sorted ranks)"
            )
        intra = [ranks[n * L : (n + 1) * L] for n in range(N)]
        inter = [ranks[i::L] for i in range(L)]
        if not default:  # only this group's members build its subgroups
            return (
                dist.new_group(intra[self.node], use_local_synchronization=True),
                dist.new_group(inter[self.local_rank], use_local_synchronization=True),
            )
        # every rank of the default group creates every subgroup, in the same order
        intra_groups = [dist.new_group(r) for r in intra]
        inter_groups = [dist.new_group(r) for r in inter]
        return intra_groups[self.node], inter_groups[self.local_rank]

    def reset_counters(self) -> None:
        """Zero :attr:`bytes_sent`, :attr:`calls`, :attr:`steps` and :attr:`size_checks`."""
        self.bytes_sent = 0
        self.calls = 0
        self.steps = 0
        self.size_checks = 0

    @property
    def residual_keys(self) -> tuple:
        """The ``key`` of every bucket holding an error-feedback residual, first use first
        (empty without ``error_feedback`` and after :meth:`clear_residuals`)."""
        return tuple(self._residuals)

    def clear_residuals(self) -> None:
        """Forget the error-feedback residuals (e.g. after loading a checkpoint)."""
        self._residuals.clear()

    def wire_nbytes(self, n: int) -> int:
        """Bytes this rank sends for an ``n``-value bucket (:func:`hook_wire_nbytes`)."""
        return hook_wire_nbytes(
            n, self.world_size, self.ranks_per_node, self.bits, self.intra_bits, self.group
        )

    def __getstate__(self):
        """Only the configuration pickles (process groups cannot); unpickling rebuilds the
        state on the default process group, with fresh residuals and counters."""
        return dict(self._config)

    def __setstate__(self, config):
        self.__init__(**config)

    def _residual(self, key, signature) -> dict:
        entry = self._residuals.get(key)
        if entry is None or entry[0] != signature:
            entry = self._residuals[key] = (signature, {})
        return entry[1]

    def _generator(self, device):
        if not self.stochastic:
            return None
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device).manual_seed(self.seed * 65537 + self.rank)
            self._generators[device] = gen
        return gen


def _exchange(wire, group) -> torch.Tensor:
    """Rows of ``wire`` sent one to each rank of ``group``; rows received, in rank order."""
    out = torch.empty_like(wire)
    dist.all_to_all_single(out, wire, group=group)
    return out


def _start_size_check(st: QuantizedAllReduceState, n: int, device):
    """Start all-gathering every rank's value count ``n`` (None with one rank); the
    quantization of the first stage overlaps it. Finish with :func:`_finish_size_check`
    before the first exchange: gloo aborts the process (SIGABRT) on collectives of
    unequal sizes, a plain ``all_reduce`` included."""
    if st.world_size == 1:
        return None
    sizes = torch.empty(st.world_size, 1, dtype=torch.int64, device=device)
    mine = torch.tensor([n], dtype=torch.int64, device=device)
    work = dist.all_gather(list(sizes.unbind(0)), mine, group=st.process_group, async_op=True)
    return sizes, work


def _finish_size_check(pending) -> None:
    """ValueError on every rank unless the counts gathered by :func:`_start_size_check`
    are all equal; None (nothing pending) passes. Returns None: nothing is left pending."""
    if pending is None:
        return None
    sizes, work = pending
    work.wait()
    sizes = sizes.view(-1).tolist()
    if min(sizes) != max(sizes):
        raise ValueError(
            f"quantized_allreduce needs the same number of values on every rank, got {sizes} "
            "(by rank): pass a tensor of the same size on every rank (with DDP, the same "
            "parameters in the same order)"
        )
    return None


def _fill_nonfinite(y, group: int) -> None:
    """Replace in place each non-finite value of contiguous ``y`` (whole groups) by the
    midpoint of its group's finite values (0 in a group without any), so the group's
    minimum and maximum, hence its scale, are those of its finite values."""
    g = y.view(-1, group)
    fin = torch.isfinite(g)
    lo = torch.where(fin, g, math.inf).amin(1, keepdim=True)
    hi = torch.where(fin, g, -math.inf).amax(1, keepdim=True)
    mid = torch.where(fin.any(1, keepdim=True), lo * 0.5 + hi * 0.5, 0.0)  # halves: no overflow
    g.copy_(torch.where(fin, g, mid))


def _quantize_finite(y, bits: int, gen, kw: dict):
    """Wire rows of float32 rows ``y [k, m]`` (whole groups), quantized over finite values
    only, and what this rank left out: None when nothing (the common case, told by the
    group scales alone), else float32 like ``y`` holding each non-finite value in place,
    NaN over a group whose finite range still overflows float32 (module docstring), 0
    elsewhere. Left-out values are replaced in ``y`` (:func:`_fill_nonfinite`, zeros
    over an overflowing group), so the caller's residuals stay finite."""
    wire, scale = quantize_rows_scaled(y, bits=bits, generator=gen, **kw)
    if scale.isfinite().all():
        return wire, None
    group = kw["group"]
    left = torch.where(torch.isfinite(y), 0.0, y)
    _fill_nonfinite(y, group)
    wire, scale = quantize_rows_scaled(y, bits=bits, generator=gen, **kw)
    over = ~scale.isfinite().view(-1)
    if over.any():
        y.view(-1, group)[over] = 0.0
        left.view(-1, group)[over] = math.nan
        wire = quantize_rows_scaled(y, bits=bits, generator=gen, **kw)[0]
    return wire, left


def _note(left, stage_left, size: int, device, place):
    """Add a stage's left-out values to ``left`` (``size`` values in the padded bucket's
    order, created on first use) through ``place(left)``, the stage's view of it."""
    if stage_left is None:
        return left
    if left is None:
        left = torch.zeros(size, dtype=torch.float32, device=device)
    place(left).add_(stage_left)
    return left


def _restore_nonfinite(st: QuantizedAllReduceState, left, out, res: dict):
    """``out`` (the padded bucket's average) with plain all-reduce's non-finite values
    where some rank left values out: their sum over ranks, one float32 all-reduce of
    ``left`` (zeros on ranks that left nothing out). The residuals restart at zero
    there, as plain DDP restarts after a skipped step; elsewhere they are kept."""
    L, N = st.ranks_per_node, st.nodes
    s = out.numel() // st.world_size
    left = torch.zeros_like(out) if left is None else left
    dist.all_reduce(left, group=st.process_group)
    bad = ~torch.isfinite(left)
    places = {
        "a": lambda t: t,
        "b": lambda t: t.view(L, N * s)[st.local_rank],
        "c": lambda t: t.view(L, N, s)[st.local_rank, st.node],
    }
    for name, place in places.items():
        if name in res:
            res[name].masked_fill_(place(bad), 0.0)
    return torch.where(bad, left, out)


def _finish_bound(st: QuantizedAllReduceState, bound, gathered, half: float, n: int) -> None:
    """Set ``st.last_error_bound``: the stages-1-2 ``bound`` (padded bucket order) averaged
    over the ranks, plus ``half`` the scales of the all-gathered rows, first ``n`` values."""
    L, N = st.ranks_per_node, st.nodes
    s = bound.numel() // st.world_size
    dist.all_reduce(bound, group=st.process_group)
    scales = row_scales(gathered, s, st.bits, st.group).view(N, L, s).transpose(0, 1)
    st.last_error_bound = bound.div_(st.world_size).add_(scales.reshape(-1), alpha=half)[:n]


def quantized_allreduce(
    state: QuantizedAllReduceState, tensor, key=0, *, last=True, signature=None, check_sizes=True
):
    """Average of float ``tensor`` over the ranks of ``state``'s group, quantized as the module
    docstring says (a new tensor of the same shape and dtype). ``key`` names the
    error-feedback residual (one per bucket); a residual whose ``signature`` (default:
    the size) differs is dropped. ``last`` counts a step in ``state.steps``. Every rank
    must pass the same number of values: ``check_sizes`` all-gathers the counts first
    (ValueError on every rank if they differ; pass False only where the sizes are known
    equal, the same on every rank). Non-finite values come back where plain all-reduce
    has them (module docstring)."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        raise ValueError("quantized_allreduce takes a float tensor")
    st = state
    W, L, N = st.world_size, st.ranks_per_node, st.nodes
    n = tensor.numel()
    pending = _start_size_check(st, n, tensor.device) if check_sizes else None
    s = shard_size(n, W, st.group)
    half = 1.0 if st.stochastic else 0.5  # bound per value, in units of its group's scale
    kw = {"group": st.group, "hadamard": st.hadamard, "seed": st.seed}
    gen = st._generator(tensor.device)
    res = st._residual(key, n if signature is None else signature) if st.error_feedback else {}
    bound = torch.zeros(W * s, device=tensor.device) if st.record_error_bound else None
    sent = (W - 1) * _SIZE_BYTES if pending else 0
    left = None  # values this rank left out of the quantization, bucket order (rare)

    x = torch.zeros(W * s, dtype=torch.float32, device=tensor.device)
    x[:n] = tensor.reshape(-1)
    if L > 1:  # stage 1: intra-node reduce-scatter of chunks
        if "a" in res:
            x += res["a"]
        wire, got = _quantize_finite(x.view(L, N * s), st.intra_bits, gen, kw)
        left = _note(left, got, W * s, x.device, lambda t: t.view(L, N * s))
        pending = _finish_size_check(pending)  # before any state changes
        if st.error_feedback:
            res["a"] = x - dequantize_rows(wire, N * s, st.intra_bits, **kw).view(-1)
        if bound is not None:
            bound.view(L, N * s).add_(row_scales(wire, N * s, st.intra_bits, st.group), alpha=half)
        sent += (L - 1) * wire.shape[1]
        chunk = dequantize_rows(_exchange(wire, st.intra_group), N * s, st.intra_bits, **kw)
        chunk = chunk.sum(0)
    else:
        chunk = x
    # stage 2: inter-node reduce-scatter of shards
    if "b" in res:
        chunk = chunk + res["b"]
    wire, got = _quantize_finite(chunk.view(N, s), st.bits, gen, kw)
    left = _note(left, got, W * s, x.device, lambda t: t.view(L, N, s)[st.local_rank])
    pending = _finish_size_check(pending)
    if st.error_feedback:
        res["b"] = chunk - dequantize_rows(wire, s, st.bits, **kw).view(-1)
    if bound is not None:
        scales = row_scales(wire, s, st.bits, st.group).view(-1)
        bound.view(L, N * s)[st.local_rank].add_(scales, alpha=half)
    sent += (N - 1) * wire.shape[1]
    shard = dequantize_rows(_exchange(wire, st.inter_group), s, st.bits, **kw).sum(0).div_(W)
    # stage 3: all-gather of the averaged shards, each row with a flag byte: left anything out
    if "c" in res:
        shard += res["c"]
    wire, got = _quantize_finite(shard[None], st.bits, gen, kw)
    place = lambda t: t.view(L, N, s)[st.local_rank, st.node][None]  # noqa: E731
    left = _note(left, got, W * s, x.device, place)
    row = torch.cat([wire[0], wire.new_full((_FLAG_BYTES,), left is not None)])
    gathered = torch.empty(W, row.numel(), dtype=torch.uint8, device=tensor.device)
    dist.all_gather(list(gathered.unbind(0)), row, group=st.process_group)
    sent += (W - 1) * row.numel()
    full = dequantize_rows(gathered[:, :-_FLAG_BYTES], s, st.bits, **kw)  # row r: rank r's shard
    if st.error_feedback:
        res["c"] = shard - full[st.rank]
    out = full.view(N, L, s).transpose(0, 1).reshape(-1)
    if gathered[:, -1].any():  # rare: some rank left non-finite values out
        out = _restore_nonfinite(st, left, out, res)
        sent += ring_allreduce_nbytes(W * s, W)
    if bound is not None:
        _finish_bound(st, bound, gathered[:, :-_FLAG_BYTES], half, n)
    st.bytes_sent += sent
    st.calls += 1
    st.steps += bool(last)
    st.size_checks += check_sizes and W > 1  # one rank: nothing to check against
    return out[:n].view(tensor.shape).to(tensor.dtype)


def quantized_allreduce_hook(state: QuantizedAllReduceState, bucket):
    """DDP communication hook: a completed ``torch.futures.Future`` of the bucket's average
    (same shape and dtype as ``bucket.buffer()``), computed by :func:`quantized_allreduce`.
    Sizes are checked across ranks at a bucket's first call (and after DDP rebuilds its
    buckets) only: DDP builds the same buckets on every rank."""
    buf = bucket.buffer()
    signature = (buf.numel(), tuple(p.data_ptr() for p in bucket.parameters()))
    checked = state._sizes_checked
    out = quantized_allreduce(
        state, buf, bucket.index(), last=bucket.is_last(), signature=signature,
        check_sizes=checked.get(bucket.index()) != signature,
    )  # fmt: skip
    checked[bucket.index()] = signature
    fut = torch.futures.Future()
    fut.set_result(out)
    return fut
