import math

import numpy as np
import pytest
from tensorpress.compress import ErrorBound
from tensorpress.compress.bounds import finite_range


def test_exactly_one_bound():
    with pytest.raises(ValueError, match="exactly one"):
        ErrorBound.from_kwargs()
    with pytest.raises(ValueError, match="exactly one"):
        ErrorBound.from_kwargs(abs=1, rel=1)
    assert ErrorBound.from_kwargs(pw_rel=0.1).mode == "pw_rel"


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "x", None])
def test_invalid_values(bad):
    with pytest.raises(ValueError, match="bound must be"):
        ErrorBound("abs", bad)


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown error-bound mode"):
        ErrorBound("psnr", 1.0)


def test_rel_resolves_over_finite_range():
    x = np.array([np.nan, -2.0, 3.0, np.inf, -np.inf], np.float32)
    b = ErrorBound("rel", 0.1).resolve(x)
    assert b.tolerance == pytest.approx(0.5)
    assert finite_range(x) == (-2.0, 3.0)


def test_rel_on_constant_and_all_nonfinite_is_lossless():
    assert ErrorBound("rel", 0.1).resolve(np.full(10, 7.0)).tolerance == 0.0
    assert ErrorBound("rel", 0.1).resolve(np.full(3, np.nan)).tolerance == 0.0
    assert ErrorBound("rel", 0.1).resolve(np.empty(0)).tolerance == 0.0


def test_rel_on_huge_range_stays_finite():
    x = np.array([-1e308, 1e308])
    tol = ErrorBound("rel", 1e-3).resolve(x).tolerance
    assert math.isfinite(tol) and tol > 0


def test_dict_round_trip():
    b = ErrorBound("rel", 1e-3).resolve(np.arange(5.0))
    assert ErrorBound.from_dict(b.to_dict()) == b


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize(
    "special",
    ["none", "nan", "inf", "all_nan", "nan_and_inf", "signed_zero", "tiny"],
)
def test_finite_range_on_threads_equals_one_thread(monkeypatch, dtype, threads, special):
    from tensorpress.compress import bounds

    monkeypatch.setattr(bounds, "PARALLEL_RANGE_ELEMENTS", 16)
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(1001) * 100).astype(dtype)
    if special == "nan":
        x[[0, 500, 1000]] = np.nan
    elif special == "inf":
        x[3], x[700] = np.inf, -np.inf
    elif special == "all_nan":
        x[:] = np.nan
    elif special == "nan_and_inf":
        x[::2] = np.nan
        x[1::4] = np.inf
    elif special == "signed_zero":
        x[:] = 0.0
        x[600] = -0.0
    elif special == "tiny":
        x[:] = 1e-40 if dtype != np.float16 else 1e-7  # denormals
        x[999] = -x[999]
    want = finite_range(x)
    got = finite_range(x, threads)
    assert got == want and all(type(v) is float for v in got)
    assert finite_range(x[::3], threads) == finite_range(x[::3])  # not contiguous
    assert finite_range(x.reshape(7, 143), threads) == want


def _ranged_arrays():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((23, 7)) * 40).astype(np.float32)
    x[3, 2], x[17, 0], x[9] = np.nan, -np.inf, np.inf  # a whole row of infinities
    edge = x.copy()
    edge[-1, -1] = 1e4  # the extreme in the last, short block
    return {
        "specials": x,
        "edge": edge,
        "none_finite": np.full((5, 3), np.nan, np.float64),
        "empty_rows": np.zeros((6, 0), np.float32),
        "no_rows": np.zeros((0, 4), np.float16),
        "scalar": np.array(-2.5, np.float64),
    }


@pytest.mark.parametrize("name", list(_ranged_arrays()))
@pytest.mark.parametrize("rows", [1, 4, 100])
def test_rows_range_is_the_finite_range(name, rows):
    """A row source read a few rows at a time has the range of the whole array, blocks
    with no finite value and a short last block included."""
    from tensorpress.compress.bounds import rows_range

    x = _ranged_arrays()[name]
    assert rows_range(x, rows) == finite_range(x)
    bound = ErrorBound("rel", 1e-2)
    assert bound.resolve_rows(x, rows) == bound.resolve(x)
    assert ErrorBound("abs", 0.5).resolve_rows(x, rows).tolerance == 0.5


@pytest.mark.parametrize("name", list(_ranged_arrays()))
def test_tensor_range_is_the_finite_range(name):
    torch = pytest.importorskip("torch")
    from tensorpress.compress.bounds import tensor_finite_range

    x = _ranged_arrays()[name]
    t = torch.from_numpy(x)
    assert tensor_finite_range(t) == finite_range(x)
    bound = ErrorBound("rel", 1e-2)
    assert bound.resolve_tensor(t) == bound.resolve(x)
    assert ErrorBound("pw_rel", 0.1).resolve_tensor(t).tolerance == 0.1
