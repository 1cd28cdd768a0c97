"""ShufflePlan: every sample once per epoch (per rank), DistributedSampler's sharding
rules, reproducible orders, and permutations that are uniform where it can be measured."""

from __future__ import annotations

import os

import numpy as np
import pytest
from tensorpress.loaders.permutation import SMALL, fill_permuted, permutation, permuted
from tensorpress.loaders.plan import ShufflePlan
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import DistributedSampler, Sampler


@pytest.mark.parametrize("n", [1, 2, 7, 1000, SMALL + 1001])
def test_each_epoch_is_a_permutation(n):
    plan = ShufflePlan(n, epochs=3, seed=5)
    orders = [plan.indices(e) for e in range(3)]
    for order in orders:
        assert order.dtype == np.int64 and len(order) == len(plan) == n
        assert np.array_equal(np.sort(order), np.arange(n))
    if n > 2:
        assert not np.array_equal(orders[0], orders[1])  # a new order every epoch


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n", [1, 5, 10, 64, SMALL + 3])
def test_shards_follow_distributed_sampler(n, world, drop_last):
    if drop_last and n < world:
        with pytest.raises(ValueError, match="empty"):
            ShufflePlan(n, epochs=1, seed=0, world_size=world, drop_last=drop_last)
        return
    plans = [
        ShufflePlan(n, epochs=2, seed=9, world_size=world, rank=r, drop_last=drop_last)
        for r in range(world)
    ]
    for r, plan in enumerate(plans):
        sampler = DistributedSampler(range(n), num_replicas=world, rank=r, drop_last=drop_last)
        assert len(plan) == len(sampler)
    for e in range(2):
        shards = [p.indices(e) for p in plans]
        both = np.concatenate(shards)
        counts = np.bincount(both, minlength=n)
        if drop_last:  # disjoint, each sample at most once
            assert counts.max() <= 1 and counts.sum() == (n // world) * world
        else:  # covering; the padding repeats the epoch's first samples
            padded = -(-n // world) * world
            assert counts.min() >= 1 and counts.sum() == padded
            assert counts.max() <= -(-padded // n)


def test_same_seed_same_order_and_random_access():
    a, b = ShufflePlan(5000, epochs=4, seed=3), ShufflePlan(5000, epochs=4, seed=3)
    c = ShufflePlan(5000, epochs=4, seed=4)
    assert np.array_equal(a.indices(2), b.indices(2))
    assert not np.array_equal(a.indices(2), c.indices(2))
    shard = ShufflePlan(SMALL + 77, epochs=2, seed=1, world_size=3, rank=2)
    order = shard.indices(1)
    for pos in (0, 1, 12345, len(shard) - 1):
        assert shard.index(1, pos) == order[pos]
    small = ShufflePlan(10, epochs=1, seed=1)
    assert [small.index(0, p) for p in range(10)] == small.indices(0).tolist()


@pytest.mark.parametrize("n", [10, 100])
def test_positions_and_values_are_uniform(n):
    """Over 4000 seeds, how often value v lands at position j: a chi-square test of the
    n x n table against uniform (a biased construction fails this by many sigmas)."""
    keys = 4000
    table = np.zeros((n, n))
    for k in range(keys):
        p = permutation(n, k)
        table[np.arange(n), p] += 1
    expected = keys / n
    chi2 = ((table - expected) ** 2 / expected).sum()
    dof = (n - 1) ** 2
    assert abs(chi2 - dof) / np.sqrt(2 * dof) < 5


def _chi2_z(table: np.ndarray, expected: np.ndarray) -> float:
    chi2 = ((table - expected) ** 2 / expected).sum()
    dof = (table.shape[0] - 1) * (table.shape[1] - 1) if table.ndim == 2 else table.size - 1
    return abs(chi2 - dof) / np.sqrt(2 * dof)


@pytest.mark.parametrize("key", [0, 1])
def test_large_permutation_tables_are_uniform(key):
    """Beyond SMALL (the keyed bijection): position bin x value bin (100 x 100) and the
    low 8 bits of consecutive values (256 x 256) are uniform by a chi-square test."""
    n = SMALL + 1001
    p = permutation(n, key)
    bins = 100
    pos, val = (np.arange(n) * bins) // n, (p * bins) // n
    table = np.zeros((bins, bins))
    np.add.at(table, (pos, val), 1)
    expected = np.outer(np.bincount(pos, minlength=bins), np.bincount(val, minlength=bins)) / n
    assert _chi2_z(table, expected) < 5
    low = p % 256
    pairs = np.bincount(low[:-1] * 256 + low[1:], minlength=256 * 256).astype(float)
    assert _chi2_z(pairs, np.full(pairs.shape, (n - 1) / 256**2)) < 5


@pytest.mark.parametrize(("n", "start", "step"), [(SMALL + 77, 0, 1), (3 * SMALL + 5, 7, 3)])
def test_block_walks_equal_the_one_position_walk(n, start, step):
    """fill_permuted's compacted cycle walks give what permuted gives position by
    position (several blocks, 512 positions each, with walks of every length)."""
    out = np.empty(5000, np.int64)
    fill_permuted(out, start, step, n, 123)
    expected = [permuted((start + k * step) % n, n, 123) for k in range(out.size)]
    assert out.tolist() == expected


def test_large_permutation_has_no_position_trend():
    n = SMALL + 4099
    p = permutation(n, 11)
    assert np.array_equal(np.sort(p), np.arange(n))
    pos = np.arange(n, dtype=np.float64)
    assert abs(np.corrcoef(pos, p)[0, 1]) < 0.01
    # neighbours in the order are not neighbours in the data
    assert np.mean(np.abs(np.diff(p)) < 16) < 0.001


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_samples"):
        ShufflePlan(0, epochs=1, seed=0)
    with pytest.raises(ValueError, match="epochs"):
        ShufflePlan(10, epochs=0, seed=0)
    with pytest.raises(ValueError, match="seed"):
        ShufflePlan(10, epochs=1, seed=-1)
    with pytest.raises(ValueError, match="rank"):
        ShufflePlan(10, epochs=1, seed=0, world_size=2, rank=2)
    plan = ShufflePlan(10, epochs=2, seed=0)
    with pytest.raises(IndexError, match="epoch"):
        plan.indices(2)
    with pytest.raises(IndexError, match="position"):
        plan.index(0, 10)


def test_a_forked_worker_computes_large_epochs_after_its_parent():
    """DataLoader workers are forked after the main process planned an epoch: the child
    must compute the same order (numba's OpenMP parallel loops would abort it)."""
    plan = ShufflePlan(SMALL + 1001, epochs=2, seed=4)
    want = plan.indices(1)
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 when it gets the same order
        os._exit(0 if np.array_equal(plan.indices(1), want) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


# ------------------------------------------------------------------ windowed (locality) orders


def test_window_zero_is_the_uniform_order_exactly():
    for n in (7, 1000, SMALL + 5):
        base = ShufflePlan(n, epochs=2, seed=8, world_size=3, rank=1)
        same = ShufflePlan(n, epochs=2, seed=8, world_size=3, rank=1, chunk_samples=4, window=0)
        assert np.array_equal(base.indices(1), same.indices(1))
        assert same.index(1, 2) == base.index(1, 2)


@pytest.mark.parametrize("n", [1, 3, 7, 64, 1001, 4099])
@pytest.mark.parametrize(("chunk", "window"), [(1, 5), (4, 16), (4, 13), (3, 30), (8, 10_000)])
def test_windowed_epochs_are_permutations(n, chunk, window):
    plan = ShufflePlan(n, epochs=3, seed=2, chunk_samples=chunk, window=window)
    assert plan.window % chunk == 0 and plan.window >= window
    orders = [plan.indices(e) for e in range(3)]
    for order in orders:
        assert order.dtype == np.int64 and len(order) == n
        assert np.array_equal(np.sort(order), np.arange(n))
    if n > 7:
        assert not np.array_equal(orders[0], orders[1])
    again = ShufflePlan(n, epochs=3, seed=2, chunk_samples=chunk, window=window)
    assert np.array_equal(again.indices(2), orders[2])
    if n > 7:
        other = ShufflePlan(n, epochs=3, seed=3, chunk_samples=chunk, window=window)
        assert not np.array_equal(other.indices(2), orders[2])


@pytest.mark.parametrize("world", [2, 3, 7])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n", [10, 1001])
def test_windowed_shards_are_disjoint_and_cover(n, world, drop_last):
    kw = dict(epochs=2, seed=4, world_size=world, drop_last=drop_last, chunk_samples=4)
    plans = [ShufflePlan(n, rank=r, window=32, **kw) for r in range(world)]
    whole = ShufflePlan(n, epochs=2, seed=4, chunk_samples=4, window=32).indices(1)
    padded = -(-n // world) * world
    for r, plan in enumerate(plans):
        sampler = DistributedSampler(range(n), num_replicas=world, rank=r, drop_last=drop_last)
        assert len(plan) == len(sampler)
        order = plan.indices(1)
        want = whole[np.arange(r, len(plan) * world, world) % n]  # the sampler's rule
        assert np.array_equal(order, want)
        for pos in (0, len(plan) // 2, len(plan) - 1):
            assert plan.index(1, pos) == order[pos]
    counts = np.bincount(np.concatenate([p.indices(1) for p in plans]), minlength=n)
    if drop_last:
        assert counts.max() <= 1 and counts.sum() == (n // world) * world
    else:
        assert counts.min() >= 1 and counts.sum() == padded


def test_windowed_large_epoch_and_index():
    n = SMALL + 1001  # the chunk order past SMALL chunks uses the keyed bijection
    plan = ShufflePlan(n, epochs=2, seed=6, chunk_samples=1, window=64)
    order = plan.indices(1)
    assert np.array_equal(np.sort(order), np.arange(n))
    for pos in (0, 77, n - 1):
        assert plan.index(1, pos) == order[pos]


def test_windows_touch_about_window_over_chunk_chunks():
    """The locality is real: each window of W positions holds exactly W / c whole chunks
    (a uniform shuffle touches nearly W distinct chunks)."""
    n, c, w = 40_960, 8, 256
    plan = ShufflePlan(n, epochs=1, seed=1, chunk_samples=c, window=w)
    order = plan.indices(0)
    per = order.reshape(-1, w) // c
    distinct = [np.unique(row).size for row in per]
    assert max(distinct) == w // c and min(distinct) == w // c
    uniform = ShufflePlan(n, epochs=1, seed=1, chunk_samples=c).indices(0).reshape(-1, w) // c
    assert np.mean([np.unique(row).size for row in uniform]) > 0.8 * w
    # and the chunks themselves come in a random order, the samples in a random order
    assert abs(np.corrcoef(np.arange(n), order)[0, 1]) < 0.05
    assert np.mean(np.diff(order) == 1) < 0.05


def test_batch_chunk_spread_measures_the_randomness_given_up():
    n, c, b = 100_000, 8, 64
    uniform = ShufflePlan(n, epochs=2, seed=0, chunk_samples=c)
    for e in range(2):
        assert abs(uniform.batch_chunk_spread(e, b) - 1.0) < 0.02
    one = ShufflePlan(n, epochs=1, seed=0).batch_chunk_spread(0, b)  # 1-sample chunks
    assert one == pytest.approx(1.0, abs=1e-9)
    spreads = [
        ShufflePlan(n, epochs=1, seed=0, chunk_samples=c, window=w).batch_chunk_spread(0, b)
        for w in (64, 256, 1024, 8192, n)
    ]
    assert spreads[0] == pytest.approx(c / b, rel=0.02)  # whole chunks per batch
    assert spreads[1] < 0.8
    assert all(a < z + 0.01 for a, z in zip(spreads, spreads[1:], strict=False))
    assert spreads[-1] > 0.98 and spreads[-2] > 0.95
    with pytest.raises(ValueError, match="batch_size"):
        uniform.batch_chunk_spread(0, 0)


def test_windowed_bad_arguments():
    with pytest.raises(ValueError, match="chunk_samples"):
        ShufflePlan(10, epochs=1, seed=0, chunk_samples=0)
    with pytest.raises(ValueError, match="window"):
        ShufflePlan(10, epochs=1, seed=0, window=-1)


@pytest.mark.parametrize(
    ("n", "world", "drop_last"),
    [(1000, 2, False), (1001, 2, False), (1001, 3, True), (5, 4, False)],
)
def test_fixed_shards_keep_each_ranks_samples_and_reshuffle_them(n, world, drop_last):
    plans = [
        ShufflePlan(
            n, epochs=4, seed=9, world_size=world, rank=r, drop_last=drop_last, shard="fixed"
        )
        for r in range(world)
    ]
    dealt = [
        ShufflePlan(n, epochs=1, seed=9, world_size=world, rank=r, drop_last=drop_last)
        for r in range(world)
    ]
    for r, plan in enumerate(plans):
        first = plan.indices(0)
        assert np.array_equal(first, dealt[r].indices(0))  # epoch 0 is DistributedSampler's
        for e in range(1, 4):
            order = plan.indices(e)
            assert np.array_equal(np.sort(order), np.sort(first))  # the same samples ...
            assert [plan.index(e, p) for p in range(len(plan))] == order.tolist()
        if len(plan) > 20:  # ... in a fresh order every epoch
            assert not np.array_equal(plan.indices(1), first)
            assert not np.array_equal(plan.indices(1), plan.indices(2))
    union = np.concatenate([p.indices(3) for p in plans])
    if drop_last:
        assert np.unique(union).size == union.size == n // world * world
    else:
        assert set(union.tolist()) == set(range(n))
        assert union.size == -(-n // world) * world


def test_fixed_shards_hit_every_access_after_the_first_epoch():
    from tensorpress.loaders.buffer import simulate

    n, world = 4096, 2
    for r in range(world):
        fixed = ShufflePlan(n, epochs=3, seed=1, world_size=world, rank=r, shard="fixed")
        fresh = ShufflePlan(n, epochs=3, seed=1, world_size=world, rank=r)
        for plan, low, high in ((fixed, 1.0, 1.0), (fresh, 0.5, 0.75)):
            order = np.concatenate([plan.indices(e) for e in range(3)])
            rate = simulate(order, 1, len(plan), warmup=len(plan))
            assert low <= rate <= high


def test_fixed_shard_bad_arguments():
    with pytest.raises(ValueError, match="shard must be one of"):
        ShufflePlan(10, epochs=1, seed=0, shard="sticky")
    with pytest.raises(ValueError, match="window=0"):
        ShufflePlan(10, epochs=1, seed=0, world_size=2, shard="fixed", window=4)
    assert ShufflePlan(10, epochs=1, seed=0, shard="fixed").shard == "epoch"  # one rank


# ------------------------------------------------------------------ the plan as a torch Sampler


def test_the_plan_is_a_sampler_of_the_current_epoch():
    plan = ShufflePlan(37, seed=3, world_size=2, rank=1)
    assert isinstance(plan, Sampler) and plan.epoch == 0
    assert list(plan) == plan.indices(0).tolist() and len(list(plan)) == len(plan) == 19
    assert list(plan) == list(plan)  # iterating does not move the epoch on
    plan.set_epoch(4)
    assert plan.epoch == 4 and list(plan) == plan.indices(4).tolist()
    # torch's own loader batches it as it batches any sampler
    batches = [b.tolist() for b in TorchDataLoader(range(37), batch_size=5, sampler=plan)]
    assert [i for b in batches for i in b] == plan.indices(4).tolist()
    for bad in (-1, 1 << 20, 1.0, True):
        with pytest.raises(ValueError, match="epoch"):
            plan.set_epoch(bad)


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_an_unshuffled_plan_is_distributed_samplers_unshuffled_order(world, drop_last):
    for rank in range(world):
        plan = ShufflePlan(10, shuffle=False, world_size=world, rank=rank, drop_last=drop_last)
        sampler = DistributedSampler(
            range(10), num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last
        )
        for e in range(2):
            plan.set_epoch(e)
            assert list(plan) == list(sampler)
            assert [plan.index(e, p) for p in range(len(plan))] == list(sampler)
