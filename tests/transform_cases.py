"""Shared shapes of the tests of ``sz``'s transform predictors (wavelet, id 14; cdf97,
id 15): the hypothesis cases, a smooth field, the payload's side information and its
rewrite with valid CRCs, the golden-bytes check, and the compiled plugin's checks
(streams and random settings decoded bit for bit, crafted side information refused
and edits decoded as the Python decoder does them)."""

from __future__ import annotations

import contextlib
import pathlib
import random
import struct

import numpy as np
import tensorpress as tp
import zstandard
from hypothesis import strategies as st
from plugin_tools import (
    c_verdict,
    decodes_as_python,
    predictors,
    py_decode,
    special_field,
    with_side,
)
from test_bound_properties import DTYPES, KINDS, LAYOUTS, Case, log_uniform, shapes
from test_sz_predictors import sz_contents, with_payloads

#: where a predicted payload's side information's u64 length sits (after the predictor,
#: flags, eb, alpha, beta and radius), bytes
SIDE_AT = 2 + 8 * 3 + 4
DATA = pathlib.Path(__file__).parent / "data" / "v2"


@st.composite
def transform_cases(draw, predictor: str):
    """``Case``s of ``predictor``: relative bounds 1e-7 .. 1e-1 (and some absolute and
    pw_rel), the property kinds (smooth, noise, constants, specials), layouts, radii,
    chunk sizes, worker counts."""
    mode = draw(st.sampled_from(["rel", "rel", "rel", "abs", "pw_rel"]))
    return Case(
        dtype=draw(st.sampled_from(DTYPES)),
        shape=draw(shapes(1500)),
        kind=draw(st.sampled_from(KINDS)),
        seed=draw(st.integers(0, 2**32 - 1)),
        specials=draw(st.sampled_from([0.0, 0.0, 0.01, 0.1])),
        layout=draw(st.sampled_from(LAYOUTS)),
        mode=mode,
        bound=draw(log_uniform(1e-7, 1e-1)),
        bound_scale="data" if mode == "abs" else "absolute",
        predictor=predictor,
        radius=draw(st.sampled_from([32768, 32768, 16, 2])),
        chunk_bytes=draw(st.sampled_from([None, None, 64, 4096])),
        workers=draw(st.sampled_from([None, 1, 2])),
    )


def smooth(shape=(24, 30, 36), dtype=np.float32) -> np.ndarray:
    """``sin(g0 + g1) * cos(2 g_last)`` on a grid of [0, 3] per axis (2-d and up)."""
    grid = np.meshgrid(*[np.linspace(0, 3, n) for n in shape], indexing="ij")
    return (np.sin(grid[0] + grid[1]) * np.cos(2 * grid[-1])).astype(dtype)


def payload_side(blob: bytes, predictor_byte: int) -> bytes:
    """The side information of ``blob``'s first chunk, which ``predictor_byte`` codes."""
    content = sz_contents(blob)[0]
    assert content[0] == predictor_byte
    (n,) = struct.unpack_from("<Q", content, SIDE_AT)
    return content[SIDE_AT + 8 : SIDE_AT + 8 + n]


def rewrite_side(blob: bytes, side: bytes, predictor_byte: int) -> bytes:
    """``blob`` (one chunk, which ``predictor_byte`` codes) with its side information
    replaced and every CRC rewritten."""
    content = sz_contents(blob)[0]
    assert content[0] == predictor_byte
    (n,) = struct.unpack_from("<Q", content, SIDE_AT)
    content = content[:SIDE_AT] + struct.pack("<Q", len(side)) + side + content[SIDE_AT + 8 + n :]
    return with_payloads(blob, [zstandard.ZstdCompressor().compress(content)])


def assert_golden_bytes(name: str, predictor_byte: int, encoding=None) -> None:
    """The golden stream ``name``'s input encodes to its stored bytes (pw_rel's log2
    excepted, as the golden test excepts it; inside the context ``encoding``, where
    given), its first chunk is coded by ``predictor_byte``, and every finite decoded
    value is within the bound."""
    from test_golden import _golden_inputs

    x, kw = _golden_inputs()[name]
    blob = (DATA / f"{name}.tp").read_bytes()
    assert sz_contents(blob)[0][0] == predictor_byte
    if "pw_rel" not in kw:
        with encoding or contextlib.nullcontext():
            assert tp.compress(x, **kw) == blob
    y = tp.decompress(blob)
    tol = tp.info(blob)["bound"]["tolerance"]
    finite = np.isfinite(x)
    err = np.abs(y[finite].astype(np.float64) - x[finite])
    assert np.all(err <= tol * (np.abs(x[finite]) if "pw_rel" in kw else 1.0))


# -- the compiled plugin's decoder against the Python decoder ----------------------------

#: odd shapes, partial edge chunks, dimensions under a level's minimum length
SHAPES = [(301,), (37, 23), (9, 11, 13), (5, 6, 7, 8), (3, 1, 40), (17, 9, 8, 10)]
BOUNDS = [{"abs": 1e-2}, {"rel": 1e-3}, {"pw_rel": 1e-2}]


def coded(x, predictor: str, bound: dict, radius=32768, chunk_bytes=None) -> bytes:
    """``x`` coded by the sz ``predictor`` at ``bound``, in chunks of ``chunk_bytes``
    (default: about three chunks)."""
    codec = {"id": "sz", "predictor": predictor, "radius": radius, **bound}
    return tp.compress(x, codec=codec, chunk_bytes=chunk_bytes or max(64, x.nbytes // 3))


def assert_streams_decode_alike(driver, tmp, dtype: str, predictor: str, pid: int) -> None:
    """Each of ``SHAPES`` x ``BOUNDS`` (NaN, Inf and a spike in it; every other stream
    with radius 16: many escapes) decodes bit for bit in C as in Python; each chunk is
    coded by ``pid`` or stored (0), and some by ``pid``."""
    seen = set()
    for k, shape in enumerate(SHAPES):
        for b, bound in enumerate(BOUNDS):
            x = special_field(shape, dtype, k)
            stream = coded(x, predictor, bound, 16 if (k + b) % 2 else 32768)
            ids = predictors(stream)
            assert ids <= {0, pid}, (shape, bound, ids)
            seen |= ids
            decodes_as_python(driver, tmp, stream)
    assert pid in seen


def assert_random_settings_decode_alike(driver, tmp, predictor: str, seed: int, count=120):
    """``count`` random shapes (1-d to 4-d), dtypes, bounds, radii and chunk sizes from
    ``seed``: each stream decodes bit for bit in C as in Python."""
    rng = random.Random(seed)
    for case in range(count):
        shape = tuple(rng.choice([1, 2, 3, 7, 8, 9, 17, 33, 64]) for _ in range(rng.randint(1, 4)))
        x = special_field(shape, rng.choice(["<f2", "<f4", "<f8"]), case)
        bound = rng.choice([{"abs": 1e-2}, {"rel": 1e-3}, {"pw_rel": 1e-2}, {"abs": 1e-5}])
        radius, chunk_bytes = rng.choice([2, 16, 32768]), rng.choice([64, 1000, 10**6])
        decodes_as_python(driver, tmp, coded(x, predictor, bound, radius, chunk_bytes))


def assert_sides_refused_alike(driver, tmp, source: bytes, crafted: dict) -> None:
    """``source`` with each side information of ``crafted`` (name: bytes) is refused by
    the Python decoder and by the compiled one (a refusal code, no sanitizer report)."""
    for name, side in crafted.items():
        stream = with_side(source, side)
        assert py_decode(stream) is None, name
        got, code = c_verdict(driver, tmp, stream)
        assert got is None and code < 0, name


def assert_sides_decode_alike(driver, tmp, source: bytes, sides) -> None:
    """``source`` with each side information of ``sides`` decodes in C as in Python."""
    for side in sides:
        decodes_as_python(driver, tmp, with_side(source, side))
