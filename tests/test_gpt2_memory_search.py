"""The largest-batch search of benchmarks/gpt2_memory.py: the batch a GPU run reports.

A GPU run is short and rare, so a wrong search would waste it: the search must find
the exact largest batch that fits, in a logarithmic number of tries, and report a lower
bound (never a batch that did not fit) when the limit or the time budget stops it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
from hypothesis import given
from hypothesis import strategies as st

# benchmark scripts import each other by bare name: on the path only while importing
_BENCHMARKS = str(Path(__file__).resolve().parents[1] / "benchmarks")
sys.path.insert(0, _BENCHMARKS)
try:
    from gpt2_memory import OutOfTime, largest_batch
finally:
    sys.path.remove(_BENCHMARKS)


@given(largest=st.integers(0, 600), limit=st.integers(1, 512))
def test_finds_the_largest_batch_that_fits(largest, limit):
    tried = []

    def fits(batch):
        tried.append(batch)
        return batch <= largest

    batch, ended = largest_batch(fits, limit)
    assert all(1 <= b <= limit for b in tried)
    assert len(tried) <= 2 * limit.bit_length() + 1
    if ended == "exact":
        assert batch == largest
    else:
        assert ended == "limit" and largest >= batch and batch <= limit < 2 * batch
    assert batch == 0 or batch in tried and batch <= largest


@given(largest=st.integers(1, 300), budget=st.integers(0, 12))
def test_out_of_time_gives_a_batch_that_fitted(largest, budget):
    tried = []

    def fits(batch):
        if len(tried) == budget:
            raise OutOfTime
        tried.append(batch)
        return batch <= largest

    batch, ended = largest_batch(fits, 512)
    assert ended in ("exact", "time")
    assert batch <= largest and (batch == 0 or batch in tried)
    if ended == "exact":
        assert batch == largest
