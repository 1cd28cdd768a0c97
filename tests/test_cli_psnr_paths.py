"""``tensorpress compress --psnr DB`` with ``sz`` searches its paths as
``tp.compress(x, codec="sz", psnr=...)`` does: ``auto``, and where its stream codes at
few bits per value the CDF 9/7 path too, keeping the fewer bytes; to HDF5 (stream and
filter layouts) and to zarr. The target is still reached, the output names the path
(chunk streams, zarr codec config, the report's ``target.path``) and decodes with the
compiled plugin in a process without tensorpress; where ``auto`` wins the bytes are the
ones the ``auto``-only search writes."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import tensorpress as tp
import zarr
from cli_runs import run_json
from plugin_tools import (
    assert_same_bytes,
    chunk_predictors,
    plugin_library_at,
    read_without_tensorpress,
)
from tensorpress.compress.quality import psnr
from tensorpress.compress.sz import codec as sz_codec
from tensorpress.files.zarr_out import BOUND_ATTR
from tensorpress.formats import open_compressed, read_header
from test_psnr_paths import _power_law_field

CDF97 = 15  # the cdf97 predictor's id in a payload
WAVELET = {"predictor": "cdf97"}
TARGET = 40.0


def smooth() -> np.ndarray:
    """A smooth 2-d field (power spectrum k^-3) where ``tp.compress(psnr=40)`` keeps the
    CDF 9/7 path: 0.31 bits per value against auto's 0.36."""
    return _power_law_field(128)


def rough() -> np.ndarray:
    """Random walks along rows: at 40 dB auto codes at 1.65 bits per value, so the CDF
    9/7 path is searched too, and auto takes fewer bytes."""
    rng = np.random.default_rng(0)
    return np.cumsum(rng.standard_normal((300, 200)), axis=1).astype(np.float32)


def compress(capsys, monkeypatch, src, dst, target, *more, alone=False) -> dict:
    """The report of ``tensorpress compress SRC DST --psnr TARGET`` (the only float
    dataset); ``alone``: with ``auto`` searched alone, as before paths were searched."""
    with monkeypatch.context() as m:
        if alone:
            m.setattr(sz_codec, "PSNR_CDF97_RATES", (1.0, 0.0))  # an empty range
        doc = run_json(capsys, "compress", src, dst, "--psnr", target, "-q", *more)
    (report,) = doc["datasets"]
    return report


def payloads(stream: bytes) -> list[bytes]:
    """The chunk payloads of a container stream (what the header's target leaves alone)."""
    h = read_header(stream)
    return [stream[o : o + n] for o, n in zip(h.offsets, h.lengths, strict=True)]


@pytest.fixture
def inputs(tmp_path) -> dict:
    paths = {}
    for name, x in (("smooth", smooth()), ("rough", rough())):
        np.save(tmp_path / f"{name}.npy", x)
        with h5py.File(tmp_path / f"{name}.h5", "w") as f:
            f["v"] = x
        paths[name] = (x, tmp_path / f"{name}.npy", tmp_path / f"{name}.h5")
    return paths


def test_stream_layout_keeps_the_wavelet_path_as_tp_compress(capsys, monkeypatch, tmp_path, inputs):
    x, npy, _ = inputs["smooth"]
    out, alone_out = tmp_path / "out.h5", tmp_path / "alone.h5"
    d = compress(capsys, monkeypatch, npy, out, TARGET)
    alone = compress(capsys, monkeypatch, npy, alone_out, TARGET, alone=True)
    assert d["codec"]["predictor"] == "cdf97" and d["target"]["path"] == WAVELET
    assert alone["codec"]["predictor"] == "auto" and "path" not in alone["target"]
    assert d["stored_bytes"] < alone["stored_bytes"]
    with open_compressed(out) as f:
        y = f["data"][:]
    assert psnr(x, y) >= TARGET
    assert d["target"]["psnr_reached"] == pytest.approx(psnr(x, y))
    # one chunk: the stream tp.compress writes, byte for byte (its header holds no path)
    with h5py.File(out, "r") as f:
        stream = f["data"][()].tobytes()
    assert stream == tp.compress(x, codec="sz", psnr=TARGET)


def test_filter_layout_keeps_the_wavelet_path_in_its_chunks(capsys, monkeypatch, tmp_path, inputs):
    x, _, h5 = inputs["smooth"]
    out, alone_out = tmp_path / "out.h5", tmp_path / "alone.h5"
    d = compress(capsys, monkeypatch, h5, out, TARGET)
    alone = compress(capsys, monkeypatch, h5, alone_out, TARGET, alone=True)
    assert d["target"]["path"] == WAVELET and d["codec"]["predictor"] == "cdf97"
    assert d["stored_bytes"] < alone["stored_bytes"]
    with h5py.File(out, "r") as f:  # through the filter this process registered
        ds = f["v"]
        assert chunk_predictors(ds) == {CDF97}
        y = ds[()]
        (chunk,) = [ds.id.read_direct_chunk(ds.id.get_chunk_info(0).chunk_offset)[1]]
    assert psnr(x, y) >= TARGET
    assert d["target"]["psnr_reached"] == pytest.approx(psnr(x, y))
    assert payloads(chunk) == payloads(tp.compress(x, codec="sz", psnr=TARGET))
    checked = run_json(capsys, "verify", h5, out)  # every element within the bound
    assert checked["ok"] and checked["datasets"][0]["violations"] == 0


@pytest.mark.slow  # builds the plugin (about 30 s)
def test_the_wavelet_path_decodes_without_tensorpress(capsys, monkeypatch, tmp_path, inputs):
    x, _, h5 = inputs["smooth"]
    out = tmp_path / "out.h5"
    assert compress(capsys, monkeypatch, h5, out, TARGET)["target"]["path"] == WAVELET
    with h5py.File(out, "r") as f:
        want = {"v": f["v"][()]}
    plugin_dir = plugin_library_at(tmp_path / "plugin")
    assert_same_bytes(read_without_tensorpress(plugin_dir, out, ["v"], tmp_path), want)
    assert psnr(x, want["v"]) >= TARGET


def _zarr_chunks(store) -> list[bytes]:
    return [p.read_bytes() for p in sorted((store / "v" / "c").rglob("*")) if p.is_file()]


def test_zarr_keeps_the_wavelet_path_in_its_codec_config(capsys, monkeypatch, tmp_path, inputs):
    x, _, h5 = inputs["smooth"]
    out, alone_out = tmp_path / "out.zarr", tmp_path / "alone.zarr"
    inline = ("--scheduler", "inline")
    d = compress(capsys, monkeypatch, h5, out, TARGET, *inline)
    alone = compress(capsys, monkeypatch, h5, alone_out, TARGET, *inline, alone=True)
    assert d["target"]["path"] == WAVELET and d["codec"]["predictor"] == "cdf97"
    assert d["stored_bytes"] < alone["stored_bytes"]
    array = zarr.open_array(out, path="v", mode="r")
    (serializer,) = array.metadata.codecs
    assert serializer.to_dict()["configuration"]["predictor"] == "cdf97"
    record = json.loads(array.attrs[BOUND_ATTR])
    assert record["target"]["path"] == WAVELET
    y = array[()]
    assert psnr(x, y) >= TARGET
    assert record["target"]["psnr_reached"] == pytest.approx(psnr(x, y))
    (chunk,) = _zarr_chunks(out)  # one chunk: tp.compress's choice and payload
    assert payloads(chunk) == payloads(tp.compress(x, codec="sz", psnr=TARGET))


@pytest.mark.parametrize("suffix", [".h5", ".zarr"])
def test_where_auto_wins_the_bytes_are_the_auto_only_search_s(
    capsys, monkeypatch, tmp_path, inputs, suffix
):
    x, npy, h5 = inputs["rough"]
    zarr_out = suffix == ".zarr"
    src, more = (h5, ("--scheduler", "inline")) if zarr_out else (npy, ())
    out, alone_out = tmp_path / f"out{suffix}", tmp_path / f"alone{suffix}"
    d = compress(capsys, monkeypatch, src, out, TARGET, *more)
    alone = compress(capsys, monkeypatch, src, alone_out, TARGET, *more, alone=True)
    assert d["target"]["path"] == {"predictor": "auto"}  # searched, not kept
    assert d["codec"]["predictor"] == "auto"
    assert d["stored_bytes"] == alone["stored_bytes"] and d["bound"] == alone["bound"]
    if zarr_out:
        assert _zarr_chunks(out) == _zarr_chunks(alone_out)
        y = zarr.open_array(out, path="v", mode="r")[()]
    else:
        with h5py.File(out, "r") as f, h5py.File(alone_out, "r") as g:
            assert f["data"][()].tobytes() == g["data"][()].tobytes()
        with open_compressed(out) as f:
            y = f["data"][:]
    assert psnr(x, y) >= TARGET


def test_a_rate_beyond_the_wavelet_path_searches_auto_alone(capsys, monkeypatch, tmp_path, inputs):
    """At 70 dB auto codes at over 2 bits per value: nothing else is searched, and the
    record has no path, as before."""
    x, npy, _ = inputs["rough"]
    d = compress(capsys, monkeypatch, npy, tmp_path / "out.h5", 70)
    alone = compress(capsys, monkeypatch, npy, tmp_path / "alone.h5", 70, alone=True)
    assert "path" not in d["target"] and d["codec"]["predictor"] == "auto"
    assert d["stored_bytes"] == alone["stored_bytes"]
