"""Belady buffer: next uses, furthest-first eviction with bypass, simulated hit rates
(optimal on tiny sequences, far above LRU on shuffled epochs), chunk coalescing."""

from __future__ import annotations

import functools
from collections import OrderedDict

import numpy as np
import pytest
from tensorpress.loaders.buffer import BeladyBuffer, coalesce, next_uses, simulate
from tensorpress.loaders.plan import ShufflePlan
from tensorpress.loaders.slots import SampleSlots


def _next_uses_brute(order):
    order = list(order)
    out = []
    for t, s in enumerate(order):
        later = [u for u in range(t + 1, len(order)) if order[u] == s]
        out.append(later[0] if later else len(order))
    return np.array(out, dtype=np.int64)


def _epochs(n, epochs, seed=0):
    plan = ShufflePlan(n, epochs=epochs, seed=seed)
    return np.concatenate([plan.indices(e) for e in range(epochs)])


# next_uses


@pytest.mark.parametrize("length", [0, 1, 2, 5, 40, 300])
@pytest.mark.parametrize("alphabet", [1, 3, 50])
def test_next_uses_matches_brute_force(length, alphabet):
    rng = np.random.default_rng(length * 100 + alphabet)
    order = rng.integers(0, alphabet, size=length)
    got = next_uses(order)
    assert got.dtype == np.int64 and got.shape == (length,)
    assert np.array_equal(got, _next_uses_brute(order))


@pytest.mark.parametrize("offset", [-(10**12), 10**15, -(2**62)])
def test_next_uses_sparse_and_negative_ids(offset):
    rng = np.random.default_rng(1)
    order = rng.integers(0, 20, size=200)
    order = order * 10**6 + offset if offset != -(2**62) else np.where(order % 2, 2**62, -(2**62))
    assert np.array_equal(next_uses(order), _next_uses_brute(order))


def test_next_uses_rejects_non_integer_orders():
    with pytest.raises(ValueError, match="integer"):
        next_uses(np.array([0.5, 1.0]))
    with pytest.raises(ValueError, match="1-D"):
        next_uses(np.zeros((2, 2), dtype=np.int64))


# BeladyBuffer


def test_buffer_evicts_furthest_first_and_counts():
    buf = BeladyBuffer(30)
    assert buf.offer("a", 1, 10, next_use=5)
    assert buf.offer("b", 2, 10, next_use=9)
    assert buf.offer("c", 3, 10, next_use=7)
    assert buf.bytes_held == 30 and len(buf) == 3
    assert buf.offer("d", 4, 10, next_use=6)  # evicts b (9), the furthest
    assert "b" not in buf and set("acd") <= {s for s in "abcd" if s in buf}
    assert buf.offer("e", 5, 20, next_use=1)  # evicts c (7) then d (6); a (5) stays
    assert "a" in buf and "e" in buf and len(buf) == 2 and buf.bytes_held == 30
    assert buf.get("a") == 1 and buf.get("e") == 5 and buf.get("b") is None
    assert (buf.hits, buf.misses) == (2, 1)


def test_buffer_bypasses_what_is_needed_last():
    buf = BeladyBuffer(20)
    buf.offer("a", 1, 10, next_use=3)
    buf.offer("b", 2, 10, next_use=4)
    assert not buf.offer("c", 3, 10, next_use=8)  # later than everything held
    assert not buf.offer("d", 4, 10, next_use=4)  # a tie evicts nothing
    assert not buf.offer("big", 5, 21, next_use=0)  # larger than the budget
    assert {s for s in "abcd" if s in buf} == {"a", "b"} and buf.bytes_held == 20
    # b (4) alone cannot free 15 bytes and a (3) is needed sooner: nothing is evicted
    assert not buf.offer("e", 6, 15, next_use=3)
    assert "a" in buf and "b" in buf and buf.bytes_held == 20


def test_buffer_update_moves_the_next_use():
    buf = BeladyBuffer(20)
    buf.offer("a", 1, 10, next_use=2)
    buf.offer("b", 2, 10, next_use=5)
    assert buf.get("a") == 1
    buf.update("a", 9)  # a is now needed after b
    assert buf.offer("c", 3, 10, next_use=6)
    assert "a" not in buf and "b" in buf and "c" in buf
    with pytest.raises(KeyError):
        buf.update("a", 1)


def test_buffer_evicts_never_needed_first_and_keeps_them_apart():
    buf = BeladyBuffer(20, horizon=100)
    buf.offer("a", 1, 10, next_use=100)  # never
    buf.offer("b", 2, 10, next_use=50)
    assert not buf.offer("c", 3, 10, next_use=10**9)  # never does not evict never
    assert buf.offer("d", 4, 10, next_use=99)
    assert "a" not in buf and {"b", "d"} == {s for s in "abcd" if s in buf}


def test_buffer_budget_is_never_exceeded_and_tracked_exactly():
    rng = np.random.default_rng(3)
    buf = BeladyBuffer(1000)
    sizes = {}
    for t in range(3000):
        s = int(rng.integers(0, 60))
        if buf.get(s) is not None:
            buf.update(s, t + int(rng.integers(1, 200)))
        else:
            sizes[s] = int(rng.integers(0, 400))
            buf.offer(s, s * 2, sizes[s], t + int(rng.integers(1, 200)))
        held = [x for x in range(60) if x in buf]
        assert buf.bytes_held == sum(sizes[x] for x in held) <= 1000
        assert len(buf) == len(held)
    assert buf.hits + buf.misses == 3000 and buf.hits > 0
    assert not buf.offer(1, 0, 1001, 0)  # a re-offer replaces; too large: dropped
    assert 1 not in buf


def test_on_drop_sees_every_value_that_leaves_once():
    """Evicted and replaced values reach ``on_drop`` exactly once; held ones never."""
    rng = np.random.default_rng(7)
    dropped: list[int] = []
    buf = BeladyBuffer(500, on_drop=dropped.append)
    admitted: list[int] = []
    for t in range(2000):
        s = int(rng.integers(0, 40))
        if t % 7 == 0 or buf.get(s) is None:  # some re-offers of held samples
            if buf.offer(s, t, int(rng.integers(1, 200)), t + int(rng.integers(1, 300))):
                admitted.append(t)
        else:
            buf.update(s, t + int(rng.integers(1, 300)))
    assert sorted(buf) == [s for s in range(40) if s in buf]
    held = [buf.get(s) for s in buf]
    assert len(set(dropped)) == len(dropped)
    assert sorted(dropped + held) == admitted
    assert len(held) == len(buf) and dropped


def test_sample_slots_reuse_freed_slots_and_copy_rows():
    slots = SampleSlots(3, (2, 2), np.float32, (), np.int64)
    xs = [np.full((2, 2), k, np.float32) for k in range(4)]
    got = [slots.put(x, np.int64(10 + k)) for k, x in enumerate(xs)]
    assert got == [0, 1, 2, None] and slots.taken == 3  # all taken: None
    slots.free(1)
    assert slots.put(xs[3], np.int64(13)) == 1 and slots.taken == 3  # the freed slot
    xo, yo = np.zeros((2, 2, 2), np.float32), np.zeros(2, np.int64)
    slots.copy_to(1, xo, yo, 0)
    slots.copy_to(2, xo, yo, 1)
    assert (xo[0] == 3).all() and (xo[1] == 2).all() and yo.tolist() == [13, 12]
    plain = SampleSlots(1, (3,), np.uint8)
    assert plain.put(np.arange(3, dtype=np.uint8), None) == 0
    out = np.zeros((1, 3), np.uint8)
    plain.copy_to(0, out, None, 0)
    assert out.tolist() == [[0, 1, 2]]


@pytest.mark.parametrize("seed", range(5))
def test_admits_says_what_offer_does(seed):
    rng = np.random.default_rng(seed)
    buf = BeladyBuffer(100, horizon=60 if seed % 2 else None)
    for step in range(400):
        sample, nbytes, nu = int(rng.integers(40)), int(rng.integers(1, 40)), int(rng.integers(80))
        if sample in buf:
            buf.update(sample, nu)
            continue
        before = (sorted(buf), buf.bytes_held, buf.hits, buf.misses)
        admits = buf.admits(nbytes, nu)
        assert (sorted(buf), buf.bytes_held, buf.hits, buf.misses) == before  # unchanged
        assert buf.offer(sample, step, nbytes, nu) == admits


def test_buffer_rejects_bad_arguments():
    with pytest.raises(ValueError):
        BeladyBuffer(-1)
    with pytest.raises(ValueError):
        BeladyBuffer(10).offer("a", 1, -1, 0)


# simulate


def _replay_buffer(order, sizes, capacity):
    """Hit count of BeladyBuffer replaying ``order`` (the reference for the kernel)."""
    nxt, buf = next_uses(order), BeladyBuffer(capacity, horizon=len(order))
    for t, s in enumerate(order.tolist()):
        if buf.get(s) is not None:
            buf.update(s, nxt[t])
        else:
            buf.offer(s, s, sizes[s], nxt[t])
        assert buf.bytes_held <= capacity
    return buf.hits


def _replay_lru(order, sizes, capacity):
    held, hits = OrderedDict(), 0
    for s in order.tolist():
        if s in held:
            hits += 1
            held.move_to_end(s)
        elif sizes[s] <= capacity:
            while sum(held.values()) + sizes[s] > capacity:
                held.popitem(last=False)
            held[s] = sizes[s]
    return hits


@pytest.mark.parametrize("seed", range(6))
def test_simulate_matches_the_reference_replays(seed):
    rng = np.random.default_rng(seed)
    order = rng.integers(0, 40, size=600)
    sizes = rng.integers(0, 50, size=40)
    for capacity in (0, 30, 200, 700):
        want_b = _replay_buffer(order, sizes, capacity)
        want_l = _replay_lru(order, sizes, capacity)
        assert simulate(order, sizes, capacity) == pytest.approx(want_b / len(order))
        assert simulate(order, sizes, capacity, "lru") == pytest.approx(want_l / len(order))


def _best_hits(order, capacity):
    """Most hits any policy gets with ``capacity`` equal-size slots (bypass allowed)."""

    @functools.cache
    def best(t, held):
        if t == len(order):
            return 0
        s = order[t]
        if s in held:
            return 1 + best(t + 1, held)
        options = [best(t + 1, held)]  # bypass
        if len(held) < capacity:
            options.append(best(t + 1, held | {s}))
        options += [best(t + 1, (held - {v}) | {s}) for v in held]
        return max(options)

    return best(0, frozenset())


@pytest.mark.parametrize("seed", range(40))
def test_belady_is_optimal_on_tiny_sequences(seed):
    rng = np.random.default_rng(seed)
    order = rng.integers(0, 2 + seed % 4, size=8)
    capacity = 1 + seed % 3
    best = _best_hits(tuple(order.tolist()), capacity)
    assert simulate(order, 1, capacity) * len(order) == pytest.approx(best)
    assert _replay_buffer(order, np.ones(8, dtype=np.int64), capacity) == best


def test_shuffled_epochs_belady_reaches_the_buffer_fraction_lru_does_not():
    n, size = 2000, 4096
    order = _epochs(n, 3)
    quarter = n // 4 * size
    belady = simulate(order, size, quarter, warmup=n)
    lru = simulate(order, size, quarter, "lru", warmup=n)
    assert belady >= 0.95 * 0.25
    assert lru < 0.10 and belady - lru > 0.15
    assert simulate(order, size, n * size, warmup=n) == 1.0
    assert simulate(order, size, n * size, "lru", warmup=n) == 1.0
    assert simulate(order, size, quarter) == pytest.approx(belady * 2 / 3)  # epoch 0: no hits


def test_simulate_edge_cases():
    assert simulate(np.array([], dtype=np.int64), 1, 10) == 0.0
    assert simulate(np.array([3, 3]), 1, 10, warmup=2) == 0.0
    assert simulate(np.array([3, 3]), 1, 0) == 0.0  # no room at all
    assert simulate(np.array([7, 7, 7]), 0, 0) == pytest.approx(2 / 3)  # empty samples fit
    with pytest.raises(ValueError, match="policy"):
        simulate(np.array([1]), 1, 1, "fifo")
    with pytest.raises(ValueError, match="warmup"):
        simulate(np.array([1]), 1, 1, warmup=2)
    with pytest.raises(ValueError, match="entries"):
        simulate(np.array([0, 5]), np.ones(3, dtype=np.int64), 1)


# coalesce


def test_coalesce_hand_made_cases():
    assert coalesce(np.array([], dtype=np.int64), 4, 10) == []
    assert coalesce([], 4, 10) == []
    assert coalesce(np.array([5]), 4, 10) == [(4, 8)]
    assert coalesce(np.array([6, 4, 5, 6]), 4, 10) == [(4, 8)]  # one chunk, any order
    assert coalesce(np.array([3, 4]), 4, 10) == [(0, 8)]  # adjacent chunks merge
    assert coalesce(np.array([1, 9]), 4, 10) == [(0, 4), (8, 10)]  # last chunk is partial
    assert coalesce(np.array([9, 0, 13, 20, 22]), 4, 23) == [(0, 4), (8, 16), (20, 23)]
    assert coalesce(np.array([2, 0]), 1, 3) == [(0, 1), (2, 3)]
    with pytest.raises(ValueError):
        coalesce(np.array([10]), 4, 10)
    with pytest.raises(ValueError):
        coalesce(np.array([1]), 0, 10)


def test_coalesce_covers_exactly_the_touched_chunks():
    rng = np.random.default_rng(0)
    n, chunk = 1000, 16
    samples = rng.integers(0, n, size=80)
    runs = coalesce(samples, chunk, n)
    covered = np.zeros(n, dtype=bool)
    for start, stop in runs:
        assert start % chunk == 0 and (stop % chunk == 0 or stop == n) and start < stop
        covered[start:stop] = True
    touched = np.zeros(n, dtype=bool)
    for c in np.unique(samples // chunk):
        touched[c * chunk : (c + 1) * chunk] = True
    assert np.array_equal(covered, touched)
    assert all(a[1] < b[0] for a, b in zip(runs[:-1], runs[1:], strict=True))  # sorted, gapped
