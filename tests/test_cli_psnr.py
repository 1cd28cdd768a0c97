"""``tensorpress compress --psnr DB`` (and ``--set NAME:psnr=DB``): a quality target in
place of an error bound, searched per dataset, recorded in the stream and shown by
``info``; through the CLI's entry point."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import tensorpress as tp
from cli_runs import run_cli as _run
from cli_runs import run_json as _json
from tensorpress.compress.quality import psnr
from tensorpress.files import compress as file_compress
from tensorpress.formats import open_compressed, read_header


def _field(rows=300, cols=200, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.standard_normal((rows, cols)), axis=1).astype(np.float32)


@pytest.fixture
def h5_input(tmp_path):
    path = tmp_path / "in.h5"
    with h5py.File(path, "w") as f:
        f["a"] = _field()
        f["g/b"] = _field(60, 200, seed=1) * 3
        f["count"] = np.arange(10)
    return path


def _header_target(path, name):
    with h5py.File(path, "r") as f:
        return read_header(f[name][()].tobytes()).target


def test_psnr_reaches_the_target_per_dataset_and_info_shows_it(capsys, tmp_path, h5_input):
    out = tmp_path / "out.h5"
    doc = _json(
        capsys, "compress", h5_input, out, "--psnr", 60, "--set", "b:psnr=80", "--layout", "stream"
    )
    by_name = {d["name"]: d for d in doc["datasets"]}
    with h5py.File(h5_input, "r") as f, open_compressed(out) as restored:
        for name, target in (("a", 60.0), ("g/b", 80.0)):
            d = by_name[name]
            assert d["bound"]["mode"] == "abs"
            reached = psnr(f[name][()], restored[name][:])
            assert reached >= target
            # the reached PSNR recorded is the one measured on the whole written dataset
            assert d["target"] == {"psnr": target, "psnr_reached": pytest.approx(reached)}
            assert _header_target(out, name) == d["target"]
    assert "target" not in by_name["count"]  # integers are copied
    rc, text, _ = _run(capsys, "info", out)
    assert rc == 0
    assert "psnr 60 dB (reached" in text and "psnr 80 dB (reached" in text
    info = _json(capsys, "info", out)
    assert {d["name"]: d["target"] for d in info["datasets"]}["g/b"]["psnr"] == 80.0
    rc, _, err = _run(capsys, "verify", h5_input, out)
    assert rc == 0, err


def test_psnr_on_a_container_is_in_its_header_and_info(capsys, tmp_path):
    x = _field()
    np.save(tmp_path / "f.npy", x)
    out = tmp_path / "f.tp"
    rc, _, err = _run(capsys, "compress", tmp_path / "f.npy", out, "--psnr", 45, "-q")
    assert rc == 0, err
    y = tp.decompress(out.read_bytes())
    target = read_header(out.read_bytes()).target
    assert target["psnr"] == 45.0
    assert target["psnr_reached"] == pytest.approx(psnr(x, y)) and psnr(x, y) >= 45.0
    # a looser target gives a smaller file
    rc, _, _ = _run(capsys, "compress", tmp_path / "f.npy", tmp_path / "g.tp", "--psnr", 30, "-q")
    assert rc == 0
    assert (tmp_path / "g.tp").stat().st_size < out.stat().st_size
    rc, text, _ = _run(capsys, "info", out)
    assert rc == 0 and "target: psnr 45 dB (reached" in text
    assert _json(capsys, "info", out)["target"]["psnr"] == 45.0


def test_a_large_dataset_is_searched_on_a_sample_and_says_so(
    capsys, tmp_path, h5_input, monkeypatch
):
    """Beyond PSNR_SEARCH_BYTES the bound is searched on evenly spaced chunks: the
    stream records how many, and the whole dataset still reaches about the target."""
    monkeypatch.setattr(file_compress, "PSNR_SEARCH_BYTES", 64 << 10)
    out = tmp_path / "out.h5"
    doc = _json(
        capsys, "compress", h5_input, out, "--psnr", 60, "--chunk", "16K", "--layout", "stream"
    )
    a = {d["name"]: d for d in doc["datasets"]}["a"]
    searched, chunks = a["target"]["sample_chunks"]
    assert chunks == 15 and 1 <= searched < chunks  # 300 rows, 20 rows (16000 B) a chunk
    with h5py.File(h5_input, "r") as f, open_compressed(out) as restored:
        reached = psnr(f["a"][()], restored["a"][:])
    assert reached >= 60.0 - 3.0  # the sample's bound on the whole: close to the target
    rc, text, _ = _run(capsys, "info", out)
    assert rc == 0 and f"on {searched} of {chunks} chunks" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--psnr", "60", "--rel", "1e-3"], "not allowed with argument"),
        (["--psnr", "0"], "invalid PSNR"),
        (["--psnr", "nan"], "invalid PSNR"),
        (["--psnr", "60", "--codec", "quant"], "takes no error bound"),
        (["--psnr", "60", "--codec", "zstd"], "takes no error bound"),
        (["--rel", "1e-3", "--set", "a:psnr=-5"], "invalid PSNR"),
    ],
)
def test_psnr_refused_with_a_reason(capsys, tmp_path, h5_input, argv, message):
    rc, out, err = _run(capsys, "compress", h5_input, tmp_path / "o.h5", *argv)
    assert rc == 2 and out == ""
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "o.h5").exists()


def test_psnr_needs_an_abs_bound(capsys, tmp_path, h5_input, monkeypatch):
    """A bounded codec that takes no abs bound cannot search one for a PSNR."""
    from tensorpress.compress import get_codec

    codec_type = type(get_codec("sz"))
    monkeypatch.setattr(codec_type, "bound_modes", ("rel",))
    rc, _, err = _run(capsys, "compress", h5_input, tmp_path / "o.h5", "--psnr", "60")
    assert rc == 2 and "takes no abs error bound" in err
