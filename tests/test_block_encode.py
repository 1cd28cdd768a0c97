"""The ``block`` encoder's shortcut: blocks whose codes are proven to need no
reconstruction check (``check_free_codes``) write exactly the bytes of the torch
ops, which check every value, and keep the bound on every element.

Inputs sit around the shortcut's edges: codes near its limit (2047 for float32),
values half a step from two codes, huge and tiny scales, NaN and infinities.
"""

from __future__ import annotations

import numpy as np
import tensorpress as tp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorpress.compress import compress_tensor
from tensorpress.compress.block.kernels.encode import check_free_codes
from tensorpress.compress.block.kernels.layout import steps_for
from tensorpress.compress.kernels.rounding import PREC_FLOAT16, PREC_FLOAT32, PREC_FLOAT64
from tensorpress.formats import tensor_to_stream
from test_block import torch_ops_on_cpu


def test_shortcut_applies_only_where_proven():
    step, _ = steps_for(1e-3)
    assert check_free_codes(PREC_FLOAT32, False, 1e-3, step) == 2047
    assert check_free_codes(PREC_FLOAT64, False, 1e-3, step) > 2047
    assert check_free_codes(PREC_FLOAT16, False, 1e-3, step) == 0
    assert check_free_codes(PREC_FLOAT32, True, 1e-3, step) == 0  # pw_rel
    assert check_free_codes(PREC_FLOAT32, False, 0.0, 0.0) == 0
    wider = float(np.nextafter(step, np.inf))  # a step above steps_for's: no proof
    assert check_free_codes(PREC_FLOAT32, False, 1e-3, wider) == 0
    assert check_free_codes(PREC_FLOAT32, False, 2.0**-101, steps_for(2.0**-101)[0]) == 0
    assert check_free_codes(PREC_FLOAT32, False, 1e36, steps_for(1e36)[0]) == 0  # overflow


#: multiples of the step (x = code * step, before scaling): codes around the limit,
#: ties between two codes, and special values
codes = st.one_of(
    st.floats(-2100.0, 2100.0, width=32),
    st.integers(-2049, 2049).map(float),
    st.integers(-2049, 2049).map(lambda c: c + 0.5),
    st.sampled_from([0.0, -0.0, 2046.5, 2047.49, 2047.5, -2047.5, 1e-40]),
    st.floats(width=32),  # NaN, infinities, the largest floats
)


@settings(max_examples=150, deadline=None)
@given(
    xs=st.lists(codes, min_size=1, max_size=200),
    dtype=st.sampled_from([np.float32, np.float64]),
    tol=st.sampled_from([0.5, 1e-3, 1e-30, 3.0, 1e30, 1e35]),
)
def test_shortcut_writes_the_checked_bytes_and_keeps_the_bound(xs, dtype, tol):
    step, _ = steps_for(tol)
    with np.errstate(over="ignore", invalid="ignore"):
        x = (np.array(xs, np.float64) * step).astype(dtype)
    blob = tp.compress(x, abs=tol, codec="block")
    with torch_ops_on_cpu():
        checked = compress_tensor(torch.from_numpy(x), abs=tol, codec="block")
    assert tensor_to_stream(checked) == blob
    y = tp.decompress(blob)
    finite = np.isfinite(x)
    assert np.all(np.abs(y[finite].astype(np.float64) - x[finite]) <= tol)
    assert np.array_equal(y[~finite], x[~finite], equal_nan=True)


def test_codes_at_the_limit_on_both_sides():
    """Every code from -2100 to 2100 and the ties between them, at a float32 step whose
    rounding matters, in one array: the shortcut's blocks and the checked ones agree."""
    tol = 0.1
    step, _ = steps_for(tol)
    c = np.arange(-2100, 2101, dtype=np.float64)
    x = np.concatenate([c, c + 0.5, c - 0.5]) * step
    for dtype in (np.float32, np.float64):
        xd = x.astype(dtype)
        blob = tp.compress(xd, abs=tol, codec="block")
        with torch_ops_on_cpu():
            checked = compress_tensor(torch.from_numpy(xd), abs=tol, codec="block")
        assert tensor_to_stream(checked) == blob
        assert np.max(np.abs(tp.decompress(blob).astype(np.float64) - xd)) <= tol
