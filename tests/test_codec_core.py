"""The codec core: a codec's config is its whole identity, its bound included;
capabilities are declared on the class; the one-bound rule is checked in one place."""

from __future__ import annotations

import numpy as np
import pytest
import tensorpress as tp
from tensorpress.compress import Codec, ErrorBound, get_codec
from tensorpress.compress.registry import codec_class


def _field() -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.cumsum(rng.standard_normal((40, 30)), axis=1).astype(np.float32)


@pytest.mark.parametrize("mode", ["abs", "rel", "pw_rel"])
@pytest.mark.parametrize("name", ["sz", "block"])
def test_the_bound_is_part_of_the_config(name, mode):
    codec = get_codec({"id": name, mode: 1e-3})
    assert codec.bound == ErrorBound(mode, 1e-3)
    config = codec.get_config()
    assert config["id"] == name and config[mode] == 1e-3
    assert get_codec(config) == codec
    assert get_codec(config) != get_codec({"id": name, mode: 2e-3})
    # the bound inside the config is the one compress uses
    x = _field()
    assert tp.compress(x, codec=codec) == tp.compress(x, codec=name, **{mode: 1e-3})


def test_a_stream_records_the_config_without_its_bound_and_the_bound_resolved():
    x = _field()
    blob = tp.compress(x, codec={"id": "sz", "rel": 1e-3})
    info = tp.info(blob)
    assert "rel" not in info["config"]
    span = float(x.max()) - float(x.min())
    assert info["bound"]["mode"] == "rel" and info["bound"]["tolerance"] == pytest.approx(
        1e-3 * span
    )
    assert np.abs(tp.decompress(blob) - x).max() <= info["bound"]["tolerance"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: get_codec("sz", abs=1e-3, rel=1e-3), "exactly one error bound"),
        (lambda: get_codec({"id": "block", "abs": 1, "pw_rel": 1}), "exactly one error bound"),
        (lambda: get_codec("zstd", abs=1e-3), "lossless and takes no error bound"),
        (lambda: get_codec("quant", rel=1e-3), "bits-bounded and takes no error bound"),
        (lambda: get_codec("sz", rel=-1), "finite number >= 0"),
        (lambda: tp.compress(_field(), codec="sz"), "needs exactly one error bound"),
        (lambda: tp.compress(_field(), codec=get_codec("sz", abs=1), rel=1), "codec instance"),
    ],
)
def test_bound_rules(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_codec_without_a_bound_still_decodes_its_streams():
    blob = tp.compress(_field(), codec="block", abs=1e-2)
    assert tp.decompress(blob).shape == (40, 30)
    assert get_codec("block").bound is None


@pytest.mark.parametrize("name", tp.available_codecs())
def test_capabilities_are_declared_on_the_class(name):
    cls = codec_class(name)
    assert isinstance(cls.lossy, bool) and isinstance(cls.bounded, bool)
    assert cls.has_tensor_path == bool(cls.devices)
    assert not (cls.bounded and not cls.lossy)  # a lossless codec needs no bound
    if cls.reports_max_error:
        assert cls.payload_head_bytes > 0


def test_codec_is_abstract():
    with pytest.raises(TypeError):
        Codec()

    class HalfDone(Codec):
        name = "half"

        def encode(self, chunk, bound, threads=1, offset=0):
            return b""

    with pytest.raises(TypeError, match="decode"):
        HalfDone()


def test_max_error_is_reported_by_codecs_that_declare_it():
    x = _field()
    assert "max_error" in tp.info(tp.compress(x, codec="quant", bits=4))
    assert "max_error" not in tp.info(tp.compress(x, codec="sz", abs=1e-2))
