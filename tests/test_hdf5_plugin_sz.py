"""The plugin's `sz` decoder (formats/hdf5_plugin/codec_sz.c and the predictors' files)
against the Python decoder, built with AddressSanitizer and UndefinedBehaviorSanitizer:
streams of each predictor it decodes (float16/32/64, 1-d to 4-d, partial edge chunks,
NaN and Inf, abs, rel and pw_rel) decode bit for bit as `tp.decompress` decodes them;
every sz golden stream (v1 and v2, every predictor) decodes the same, or is refused as
unsupported where its predictor has no C decoder yet (``pending()``, read from
sz_predictors.c, so this tightens by itself as decoders land); CRC-valid hostile
payloads (their zstd frame re-made around mutated bytes) get the same values or the same
refusal, never a sanitizer report; h5py in a subprocess without tensorpress reads a
CLI-compressed sz file as the in-process filter does. The interpolation, fitted, match
and pivot predictors' own cases: test_hdf5_plugin_sz_predictors.py."""

from __future__ import annotations

import random
import re
import struct

import h5py
import numpy as np
import pytest
import tensorpress as tp
from plugin_tools import (  # READ, body, c_verdict, predictors, with_bodies: imported from here too
    DATA,
    READ,  # noqa: F401
    assert_same_bytes,
    body,
    built,
    c_verdict,
    chunk_predictors,
    decode_driver,
    predictors,
    py_decode,
    read_without_tensorpress,
    tally,
    with_bodies,
)
from tensorpress.cli import main
from tensorpress.formats import read_header

PLUGIN = DATA.parents[1] / "formats" / "hdf5_plugin"
#: the driver's refusal of a valid stream it does not decode (TP_E_UNSUPPORTED)
UNSUPPORTED = -6


def pending() -> set[int]:
    """Predictor ids whose entry in sz_predictors.c has no decoder (refused as
    unsupported), from the sources the driver is built from."""
    ids = dict(re.findall(r"TP_SZ_(\w+) = (\d+)", (PLUGIN / "sz.h").read_text()))
    table = (PLUGIN / "sz_predictors.c").read_text()
    none = re.findall(r"\[TP_SZ_(\w+)\] = \{\d, \d, NULL", table)
    return {int(ids[name]) for name in none if name != "RAW"}


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return decode_driver(tmp_path_factory)


def _field(shape, dtype, seed, kind="smooth"):
    rng = np.random.default_rng(seed)
    if kind == "lattice":  # values a step of 0.25 apart (an integer image, scaled)
        x = rng.integers(-60, 60, shape).cumsum(axis=-1) * 0.25 + 3.0
    elif kind == "noise":
        x = rng.standard_normal(shape)
    else:
        x = rng.standard_normal(shape).cumsum(axis=-1) + 0.05 * rng.standard_normal(shape)
    x = x.astype(dtype)
    flat = x.reshape(-1)
    if flat.size > 20:  # specials: patched exactly; zeros are patches under pw_rel
        flat[[3, 11, 17]] = [np.nan, np.inf, 0.0]
        flat[-2] = -np.inf
    return x


SHAPES = [(301,), (37, 23), (9, 11, 13), (5, 6, 7, 8), (3, 1, 40)]
BOUNDS = [{"abs": 1e-2}, {"rel": 1e-3}, {"pw_rel": 1e-2}]
#: predictor name: the ids its chunks may hold (lattice falls back to Lorenzo off a
#: lattice; any predictor to raw where prediction does not pay)
IDS = {"lorenzo": {0, 1}, "constant": {0, 6}, "regression": {0, 7}, "lattice": {0, 1, 10}}


@pytest.mark.parametrize("predictor", sorted(IDS))
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_streams_of_each_predictor_decode_bit_for_bit(driver, tmp_path, predictor, dtype):
    seen = set()
    for k, shape in enumerate(SHAPES):
        for bound in BOUNDS:
            if predictor == "lattice" and "pw_rel" in bound:
                continue  # the log domain takes no lattice
            kind = "lattice" if predictor == "lattice" and k % 2 == 0 else "smooth"
            x = _field(shape, dtype, k, kind)
            codec = {"id": "sz", "predictor": predictor, **bound}
            # small chunks: several per array, the last one partial
            stream = tp.compress(x, codec=codec, chunk_bytes=max(64, x.nbytes // 3))
            ids = predictors(stream)
            assert ids <= IDS[predictor], (shape, bound, ids)
            seen |= ids
            got, code = c_verdict(driver, tmp_path, stream)
            assert code == 0 and got == np.ascontiguousarray(tp.decompress(stream)).tobytes(), (
                shape,
                bound,
            )
    assert max(seen) > 0  # the predictor itself ran, not only raw chunks
    if predictor == "lattice":
        assert 10 in seen


def test_raw_payloads_and_a_big_endian_source_decode(driver, tmp_path):
    x = _field((40, 9), ">f8", 5)
    for bound in ({"abs": 0.0}, {"abs": 1e-3}):
        stream = tp.compress(x, codec={"id": "sz", "predictor": "lorenzo", **bound})
        got, code = c_verdict(driver, tmp_path, stream)
        assert code == 0 and got == np.ascontiguousarray(tp.decompress(stream)).tobytes()
    assert predictors(tp.compress(x, codec={"id": "sz", "abs": 0.0})) == {0}


def golden():
    """Every sz golden stream on disk (the manifests may lag behind a new file)."""
    for version in ("v1", "v2"):
        for path in sorted((DATA / version).glob("sz*.tp")):
            yield f"{version}/{path.stem}"


def test_the_golden_streams_hold_every_predictor():
    ids = set().union(*(predictors((DATA / f"{n}.tp").read_bytes()) for n in golden()))
    assert ids >= set(range(15))
    assert pending() == set()  # every predictor has its C decoder


@pytest.mark.parametrize("name", list(golden()))
def test_golden_sz_streams_decode_bit_for_bit_or_are_pending(driver, tmp_path, name):
    blob = (DATA / f"{name}.tp").read_bytes()
    got, code = c_verdict(driver, tmp_path, blob)
    if predictors(blob) & pending():
        assert got is None and code == UNSUPPORTED, name
    else:
        assert code == 0 and got == py_decode(blob), name


# -- hostile payloads ----------------------------------------------------------------


def _fields(b: bytes) -> list[int]:
    """Offsets of the u64/f64/u32 fields of a predicted body (after the 2 first bytes)."""
    at, out = 2, []
    for size in (8, 8, 8, 4):  # eb, alpha, beta, radius
        out.append(at)
        at += size
    if b[0] == 7:  # side information
        out.append(at)
        at += 8 + struct.unpack_from("<Q", b, at)[0]
    out.append(at)  # Huffman stream: its length, then n, nbits
    out += [at + 8, at + 12]
    at += 8 + struct.unpack_from("<Q", b, at)[0]
    out.append(at)  # outlier count
    return out


def mutants(b: bytes, rng: random.Random, count: int):
    """Bodies with bytes flipped, fields set to edge values, or cut short."""
    fields = _fields(b)
    for _ in range(count):
        m = bytearray(b)
        r = rng.random()
        if r < 0.4:
            for _ in range(rng.choice((1, 2, 3))):
                at = rng.randrange(len(m))
                m[at] ^= 1 << rng.randrange(8)
        elif r < 0.8:
            at = rng.choice(fields)
            value = rng.choice((0, 1, 2, 255, 2**31, 2**63, 2**64 - 1, rng.randrange(1 << 20)))
            m[at : at + 8] = value.to_bytes(8, "little")[: len(m[at : at + 8])]
        elif r < 0.9:
            del m[rng.randrange(len(m)) :]
        else:
            m[rng.randrange(len(m))] = rng.randrange(256)
        yield bytes(m)


@pytest.fixture(scope="module")
def hostile_sources():
    """One-chunk streams of each predictor here, with outliers, patches and signs."""
    out = {}
    for predictor, dtype, bound in (
        ("lorenzo", "<f4", {"abs": 1e-3}),
        ("lorenzo", "<f8", {"pw_rel": 1e-2}),
        ("regression", "<f4", {"abs": 1e-2}),
        ("constant", "<f2", {"abs": 0.1}),
        ("lattice", "<f4", {"abs": 1e-2}),
    ):
        kind = {"lattice": "lattice", "constant": "noise"}.get(predictor, "smooth")
        x = _field((24, 30), dtype, 9, kind)
        x.reshape(-1)[40] = 1e4  # an outlier
        stream = tp.compress(x, codec={"id": "sz", "predictor": predictor, **bound})
        assert read_header(stream).nchunks == 1 and predictors(stream) != {0}
        out[f"{predictor}-{dtype}-{sorted(bound)[0]}"] = stream
    return out


def _agree(driver, tmp_path, sources, seed: int, per_source: int):
    rng = random.Random(seed)
    cases = (
        (name, with_bodies(stream, {0: m}), None)
        for name, stream in sources.items()
        for m in mutants(body(stream), rng, per_source)
    )
    return tally(driver, tmp_path, cases)


def test_hostile_payloads_agree_with_python(driver, tmp_path, hostile_sources):
    decoded, refused = _agree(driver, tmp_path, hostile_sources, seed=1, per_source=40)
    assert decoded and refused


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_fuzz_hostile_payloads(driver, tmp_path, hostile_sources, seed):
    _agree(driver, tmp_path, hostile_sources, seed=100 + seed, per_source=300)


# -- h5py through the compiled plugin ---------------------------------------------------


def test_h5py_without_tensorpress_reads_a_cli_compressed_sz_file(tmp_path):
    plugin_dir = tmp_path / "plugin"
    built(lambda b: b.build_library(plugin_dir))
    src, out = tmp_path / "in.h5", tmp_path / "out.h5"
    rng = np.random.default_rng(4)
    with h5py.File(src, "w") as f:
        f["noise"] = rng.standard_normal((70, 50)).astype("<f4")
        f["be"] = rng.standard_normal((30, 20, 6)).astype(">f8")
        f["half"] = rng.standard_normal((6000,)).astype("<f2")
        f["smooth"] = rng.standard_normal((64, 64)).cumsum(0).cumsum(1).astype("<f4")
    argv = [str(src), str(out), "--layout", "filter", "--codec", "sz", "--abs", "1e-2"]
    assert main(["compress", *argv]) == 0
    names = ["be", "half", "noise", "smooth"]
    with h5py.File(out) as f:
        want = {n: f[n][...] for n in names}
        ids = set().union(*(chunk_predictors(f[n]) for n in names))
    assert_same_bytes(read_without_tensorpress(plugin_dir, out, names, tmp_path), want)
    assert len(ids) >= 2  # constant prediction (noise) and another for the smooth field
