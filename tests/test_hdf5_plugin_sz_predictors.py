"""The plugin's decoders of the `sz` predictors 2-5, 8, 9 (interpolations), 11 (fitted),
12 (row match) and 13 (pivots), built with AddressSanitizer and UndefinedBehaviorSanitizer,
against the Python decoder: streams of each (float16/32/64, big-endian too, 1-d to 4-d,
odd shapes with partial edge chunks, NaN and Inf, outliers, abs, rel and pw_rel, level
tunings of any alpha and beta) decode bit for bit as `tp.decompress` decodes them; the
golden streams that use them decode the same; crafted side information (damaged models,
row references out of range, wrong lengths, non-finite numbers) is refused as Python
refuses it, and any other edit decodes to Python's values, never with a sanitizer
report."""

from __future__ import annotations

import random
import struct

import h5py
import numpy as np
import pytest
import tensorpress as tp
from plugin_tools import (
    DATA,
    SIDE_AT,
    assert_same_bytes,
    body,
    built,
    c_decode,
    c_verdict,
    chunk_predictors,
    decode_driver,
    decodes_as_python,
    fuzz_bodies,
    predictors,
    py_decode,
    read_without_tensorpress,
    refused_alike,
    side_of,
    with_bodies,
    with_side,
)
from tensorpress.compress.sz import pivot as sz_pivot
from tensorpress.formats import hdf5_filter, read_header

#: the predictor ids decoded by these files
MINE = {2, 3, 4, 5, 8, 9, 11, 12, 13}


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return decode_driver(tmp_path_factory)


def _specials(x: np.ndarray, spike: bool = True) -> np.ndarray:
    """``x`` with NaN, +-Inf, a zero (patches) and, with ``spike``, an outlier in it."""
    flat = x.reshape(-1)
    if flat.size > 24:
        flat[[3, 11, 17]] = [np.nan, np.inf, 0.0]
        flat[-2] = -np.inf
        if spike:
            flat[20] = flat[19] + 300.0
    return x


def smooth(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).cumsum(axis=-1) + 0.05 * rng.standard_normal(shape)
    return _specials(x.astype(dtype))


def ripple(shape, dtype, seed=0):
    """A smooth field with a grid-scale ripple along its last dimension: the fit's data."""
    x = np.random.default_rng(seed).standard_normal(shape).cumsum(axis=-1).cumsum(axis=0)
    x = x / np.abs(x).max() * 100.0 * (1 + 0.2 * (-1.0) ** np.arange(shape[-1]))
    return _specials(x.astype(dtype))


def tokens(shape, dtype, seed=0, vocab=6):
    """Rows (the last dimension) that nearly repeat: the row match's data."""
    rng = np.random.default_rng(seed)
    rows = int(np.prod(shape[:-1]))
    table = rng.standard_normal((vocab, shape[-1]))
    x = table[rng.integers(0, vocab, rows)] + 0.02 * rng.standard_normal((rows, shape[-1]))
    return _specials(x.reshape(shape).astype(dtype))


def low_rank(shape, dtype, seed=0, rank=5, log=False):
    """Rows in a low-dimensional space (``log``: their magnitudes are): the pivots' data."""
    rng = np.random.default_rng(seed)
    rows = int(np.prod(shape[:-1]))
    coords = rng.standard_normal((rows, rank)) * 0.8 ** np.arange(rank)
    x = coords @ rng.standard_normal((rank, shape[-1]))
    x = x + 1e-3 * rng.standard_normal(x.shape)
    if log:  # log2|x| low rank, some columns negative
        x = np.where(np.arange(shape[-1]) % 7 == 0, -1.0, 1.0) * 2.0**x
    return _specials(x.reshape(shape).astype(dtype), spike=False)  # a spike spoils the fit


INTERP = {"linear": 2, "cubic": 3, "md-linear": 4, "md-cubic": 5, "linear-rev": 8}
INTERP["cubic-rev"] = 9
SHAPES = [(301,), (37, 23), (9, 11, 13), (5, 6, 7, 8), (3, 1, 40)]
BOUNDS = [{"abs": 1e-2}, {"rel": 1e-3}, {"pw_rel": 1e-2}]
#: level tunings: the defaults, ``auto``'s own, and ones no sampling picks (pow's bits)
TUNINGS = [{}, {"alpha": 1.25, "beta": 2.0}, {"alpha": 1.37, "beta": 50.0}]


@pytest.mark.parametrize("predictor", sorted(INTERP))
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8", ">f4"])
def test_interpolation_streams_decode_bit_for_bit(driver, tmp_path, predictor, dtype):
    seen = set()
    for k, shape in enumerate(SHAPES):
        for b, bound in enumerate(BOUNDS):
            x = smooth(shape, dtype, k)
            tuning = TUNINGS[(k + b) % len(TUNINGS)]
            codec = {"id": "sz", "predictor": predictor, **tuning, **bound}
            # small chunks: several per array, the last one partial
            stream = tp.compress(x, codec=codec, chunk_bytes=max(64, x.nbytes // 3))
            ids = predictors(stream)
            assert ids <= {0, INTERP[predictor]}, (shape, bound, ids)
            seen |= ids
            decodes_as_python(driver, tmp_path, stream)
    assert INTERP[predictor] in seen


#: predictor: (data, shapes, the ids its chunks may hold: fitted falls back to Lorenzo
#: on too few interior points, match and pivot to constant prediction, any to raw)
MODELLED = {
    "fitted": (ripple, [(3000,), (40, 50), (9, 20, 31), (3, 4, 10, 12)], {0, 1, 11}),
    "match": (tokens, [(64, 256), (4, 16, 70), (2, 3, 8, 64)], {0, 6, 12}),
    "pivot": (low_rank, [(200, 64), (3, 50, 97), (2, 5, 20, 40)], {0, 6, 13}),
}


@pytest.mark.parametrize("predictor", sorted(MODELLED))
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8", ">f8"])
def test_modelled_streams_decode_bit_for_bit(driver, tmp_path, predictor, dtype):
    make, shapes, allowed = MODELLED[predictor]
    want = {"fitted": 11, "match": 12, "pivot": 13}[predictor]
    seen = set()
    for k, shape in enumerate(shapes):
        for bound in BOUNDS:
            log = predictor == "pivot" and "pw_rel" in bound
            x = make(shape, dtype, k, log=True) if log else make(shape, dtype, k)
            radius = 16 if k % 2 else 32768  # a small radius: many outliers
            codec = {"id": "sz", "predictor": predictor, "radius": radius, **bound}
            stream = tp.compress(x, codec=codec, chunk_bytes=max(256, x.nbytes // 2))
            ids = predictors(stream)
            assert ids <= allowed, (shape, bound, ids)
            seen |= ids
            decodes_as_python(driver, tmp_path, stream)
    assert want in seen


def golden_with_these_predictors() -> list[str]:
    """The golden streams (every file, listed in the manifest or not) with a chunk of a
    predictor here."""
    names = []
    for version in ("v1", "v2"):
        for path in sorted((DATA / version).glob("sz_*.tp")):
            blob = path.read_bytes()
            if read_header(blob).nchunks and predictors(blob) & MINE:
                names.append(f"{version}/{path.stem}")
    return names


def test_every_predictor_here_has_golden_streams():
    ids = set()
    for name in golden_with_these_predictors():
        ids |= predictors((DATA / f"{name}.tp").read_bytes())
    assert MINE <= ids
    assert len(golden_with_these_predictors()) >= 10


@pytest.mark.parametrize("name", golden_with_these_predictors())
def test_golden_streams_decode_as_in_python(driver, tmp_path, name):
    blob = (DATA / f"{name}.tp").read_bytes()
    got, code = c_verdict(driver, tmp_path, blob)
    assert code == 0 and got == py_decode(blob)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_random_shapes_and_settings_decode_bit_for_bit(driver, tmp_path, seed):
    """Shapes of 1 to 4 dimensions of sizes 1 to 64, every dtype, bound and predictor
    here, radii down to 2 (mostly outliers), random level tunings and chunk sizes."""
    rng = random.Random(seed)
    names = sorted(INTERP) + sorted(MODELLED)
    for case in range(150):
        shape = tuple(rng.choice([1, 2, 3, 5, 8, 17, 33, 64]) for _ in range(rng.randint(1, 4)))
        predictor = rng.choice(names)
        make = MODELLED[predictor][0] if predictor in MODELLED else smooth
        x = make(shape, rng.choice(["<f2", "<f4", "<f8"]), case)
        bound = rng.choice([{"abs": 1e-2}, {"rel": 1e-3}, {"pw_rel": 1e-2}, {"abs": 1e-5}])
        codec = {"id": "sz", "predictor": predictor, "radius": rng.choice([2, 16, 32768])}
        if predictor in INTERP and rng.random() < 0.3:
            codec.update(alpha=rng.uniform(1, 3), beta=rng.uniform(1, 100))
        stream = tp.compress(x, codec={**codec, **bound}, chunk_bytes=rng.choice([64, 1000]))
        decodes_as_python(driver, tmp_path, stream)


# -- crafted side information --------------------------------------------------------


def with_field(stream: bytes, at: int, fmt: str, value) -> bytes:
    """``stream`` (one chunk) with a field of its payload's body set."""
    b = bytearray(body(stream))
    struct.pack_into(fmt, b, at, value)
    return with_bodies(stream, {0: bytes(b)})


@pytest.fixture(scope="module")
def sources():
    """One-chunk streams of each predictor here, with outliers and patches."""
    out = {}
    for name, x, predictor, bound in (
        ("fitted", ripple((12, 40), "<f4", 1), "fitted", {"abs": 1e-2}),
        ("fitted-log", ripple((20, 30), "<f8", 2), "fitted", {"pw_rel": 1e-2}),
        ("match", tokens((32, 128), "<f4", 3), "match", {"rel": 1e-3}),
        ("match-half", tokens((16, 96), "<f2", 4), "match", {"rel": 1e-3}),
        ("pivot", low_rank((2, 64, 96), "<f4", 5, rank=30), "pivot", {"rel": 1e-4}),
        ("pivot-log", low_rank((80, 64), "<f8", 6, log=True), "pivot", {"pw_rel": 1e-3}),
        ("cubic", smooth((20, 30), "<f4", 7), "cubic", {"abs": 1e-3}),
        ("md-cubic", smooth((9, 10, 11), "<f8", 8), "md-cubic", {"abs": 1e-3}),
        ("linear-rev", smooth((40, 50), "<f2", 9), "linear-rev", {"abs": 5e-2}),
    ):
        codec = {"id": "sz", "predictor": predictor, "radius": 64, **bound}
        stream = tp.compress(x, codec=codec)
        assert read_header(stream).nchunks == 1 and predictors(stream) & MINE, name
        out[name] = stream
    assert body(out["pivot"])[SIDE_AT + 8] == 2  # two levels: a Huffman stream each but the last
    return out


def _agrees(driver, tmp_path, stream: bytes) -> bool:
    """Same values or the same refusal; whether Python decodes it."""
    want = py_decode(stream)
    assert c_decode(driver, tmp_path, stream) == want
    return want is not None


def test_damaged_fitted_models_are_refused(driver, tmp_path, sources):
    for stream in (sources["fitted"], sources["fitted-log"]):
        side = side_of(stream)
        n = side[0]
        weight = 2 + 3 * n
        bad = [
            b"",
            bytes([0, 0]),
            side[:-1],
            side + b"\0",
            bytes([n, 2]) + side[2:],  # planar neither 0 nor 1
            bytes([33, side[1]]) + side[2:] + bytes(11 * (33 - n)),  # too many terms
            side[:2] + bytes([0, 0, 0]) + side[5:],  # (0, 0, 0): not yet decoded
            side[:2] + bytes([0, 0, 1]) + side[5:],  # after the element
            side[:2] + struct.pack("<bbb", -9, 0, 0) + side[5:],  # out of reach
            side[:weight] + struct.pack("<d", np.nan) + side[weight + 8 :],
            side[:weight] + struct.pack("<d", -np.inf) + side[weight + 8 :],
        ]
        for model in bad:
            refused_alike(driver, tmp_path, with_side(stream, model))
        # valid but odd models decode as Python decodes them
        huge = side[:weight] + struct.pack("<d", 1e300) + side[weight + 8 :]
        twice = bytes([1, side[1]]) + side[2:5] + side[weight : weight + 8]
        assert _agrees(driver, tmp_path, with_side(stream, huge))
        assert _agrees(driver, tmp_path, with_side(stream, twice))


def test_out_of_range_row_references_are_refused(driver, tmp_path, sources):
    for stream in (sources["match"], sources["match-half"]):
        side = side_of(stream)
        width, rows = side[0], int(np.prod(tp.info(stream)["shape"][:-1]))
        assert width >= 1
        for refs in (
            b"",
            bytes([33]) + bytes((rows * 33 + 7) // 8),  # wider than 32 bits
            side[:-1],
            side + b"\0",
            bytes([width, side[1] | 1]) + side[2:],  # row 0 refers to a row before it
            bytes([width]) + b"\xff" * (len(side) - 1),  # every row to 2**width - 1 back
        ):
            refused_alike(driver, tmp_path, with_side(stream, refs))
        # no references (width 0), or the widest fields: the rows decode alike
        assert _agrees(driver, tmp_path, with_side(stream, bytes([0])))
        assert _agrees(driver, tmp_path, with_side(stream, bytes([32]) + bytes(4 * rows)))


def test_damaged_pivot_models_are_refused(driver, tmp_path, sources):
    for stream in (sources["pivot"], sources["pivot-log"]):
        side = side_of(stream)
        shape = tp.info(stream)["shape"]
        model, _ = sz_pivot.side_codes(side, (int(np.prod(shape[:-1])), shape[-1]))
        count = side[0]
        starts = struct.unpack_from(f"<{count}I", side, 1)
        start, bits = starts[0], side[1 + 4 * count]
        centres = 1 + 5 * count
        streams = side[len(model) :]
        edits = [
            bytes([0]) + side[1:],  # no levels
            bytes([4]) + side[1:],  # too many
            side[:1] + struct.pack("<I", 0) + side[5:],  # a level from column 0
            side[:1] + struct.pack("<I", shape[-1]) + side[5:],  # past the last column
            side[: 1 + 4 * count] + bytes([1]) + side[2 + 4 * count :],  # 1-bit weights
            side[: 1 + 4 * count] + bytes([17]) + side[2 + 4 * count :],  # 17-bit weights
            side[: len(model) - 1],  # the model cut short
            model[:centres] + struct.pack("<d", np.nan) + side[centres + 8 :],
            model[: centres + 8 * start]
            + struct.pack("<d", np.inf)
            + side[centres + 8 * start + 8 :],  # noqa: E501
            side + b"\0",  # a byte after the streams
            model + struct.pack("<Q", len(streams)) + streams[8:],  # a stream's length
            model + streams[:8],  # the streams cut short
        ]
        if count > 1:  # the second level starting at the first's column
            edits.append(side[:5] + side[1:5] + side[9:])
        for edited in edits:
            refused_alike(driver, tmp_path, with_side(stream, edited))
        # other weights (the first level's fields, after its offsets and scales): any
        # bits are weights, decoded alike
        m = (starts[1] if count > 1 else shape[-1]) - start
        at = centres + 8 * starts[-1] + 12 * m
        w = bytearray(side)
        for k in range(at, at + min(64, (start * m * bits + 7) // 8)):
            w[k] ^= 0x5A
        assert _agrees(driver, tmp_path, with_side(stream, bytes(w)))


def test_interpolation_tunings_and_bounds_edited_decode_alike(driver, tmp_path, sources):
    """Any alpha and beta within 1..2**20 (the level bounds through pow, as numpy's
    power) and bounds at the edges decode as Python decodes them; out of range refused."""
    for name in ("cubic", "md-cubic", "linear-rev"):
        stream = sources[name]
        for alpha, beta in ((1.0, 2.0**20), (1.7, 3.3), (2.0**20, 1.0), (1.0000001, 77.7)):
            edited = with_field(with_field(stream, 10, "<d", alpha), 18, "<d", beta)
            assert _agrees(driver, tmp_path, edited), (name, alpha, beta)
        for eb in (2.0**-1000, 1e-300, 1e300):
            _agrees(driver, tmp_path, with_field(stream, 2, "<d", eb))
        for alpha in (0.5, np.nan, 2.0**21):
            refused_alike(driver, tmp_path, with_field(stream, 10, "<d", alpha))


def test_mutated_payloads_agree_with_python(driver, tmp_path, sources):
    decoded, refused = fuzz_bodies(driver, tmp_path, sources, seed=3, count=15)
    assert decoded and refused


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_fuzz_mutated_payloads(driver, tmp_path, sources, seed):
    fuzz_bodies(driver, tmp_path, sources, seed=200 + seed, count=250)


# -- h5py through the compiled plugin ---------------------------------------------------


def _wave(shape):
    """A smooth field of waves: the interpolations' data."""
    i, j, k = np.meshgrid(*(np.arange(n) for n in shape), indexing="ij")
    return np.sin(i / 7.0) * np.cos(j / 5.0) + 0.5 * np.sin((k + i) / 9.0)


def _filter(x, rel: float) -> dict:
    finite = x[np.isfinite(x)].astype(np.float64)
    return hdf5_filter.filter(codec="sz", abs=float(rel * (finite.max() - finite.min())))


def test_h5py_without_tensorpress_reads_these_predictors(tmp_path):
    """Datasets written through the in-process filter whose chunks ``auto`` codes with
    the predictors here (the interpolations on waves, the fit on a large chunk of a
    rippled field, row matches on token rows, pivots on low-rank rows) read the same
    bytes through the compiled plugin in a process that never imports tensorpress."""
    plugin_dir = tmp_path / "plugin"
    built(lambda b: b.build_library(plugin_dir))
    wave = _wave((40, 48, 56))
    sets = {
        "wave": (wave.astype("<f4"), (20, 48, 56), 1e-3),
        "wave_be": (wave.astype(">f8"), (40, 24, 56), 1e-2),
        "wave_half": (wave.astype("<f2"), (40, 48, 56), 1e-3),
        "wave_2d": (wave[0].astype("<f4"), (48, 56), 1e-3),
        "wave_rows": (wave.reshape(-1, 56)[:400].astype("<f4"), (400, 56), 1e-3),
        "ripple": (ripple((8, 256, 256), "<f4", 2), (8, 256, 256), 1e-3),
        "tokens": (tokens((256, 512), "<f4", 1), (128, 512), 1e-3),
        "low_rank": (low_rank((256, 512), "<f4", 1, rank=30), (256, 512), 1e-4),
    }
    path = tmp_path / "sz.h5"
    with h5py.File(path, "w") as f:
        for name, (x, chunks, rel) in sets.items():
            f.create_dataset(name, data=x, chunks=chunks, **_filter(x, rel))
    names = sorted(sets)
    with h5py.File(path) as f:
        want = {n: f[n][...] for n in names}
        ids = set().union(*(chunk_predictors(f[n]) for n in names))
    assert {11, 12, 13} <= ids and len(ids & MINE) >= 6, ids  # 3, 5 and 9 so far
    assert_same_bytes(read_without_tensorpress(plugin_dir, path, names, tmp_path), want)
