"""``tp.compress(x, codec="sz", psnr=...)`` searches ``auto`` and, where the stream is
coded at few bits per value, the CDF 9/7 path too, and keeps the fewer bytes: the target
is still reached, and the stream names the predictor it was coded with."""

from __future__ import annotations

import numpy as np
import pytest
import tensorpress as tp
from tensorpress.compress import get_codec
from tensorpress.compress.quality import psnr as measure_psnr
from tensorpress.compress.sz import codec as sz_codec


def _power_law_field(n: int = 256, seed: int = 0) -> np.ndarray:
    """A smooth 2-d Gaussian random field (power spectrum k^-3): transform coding pays."""
    rng = np.random.default_rng(seed)
    k2 = np.fft.fftfreq(n)[:, None] ** 2 + np.fft.fftfreq(n)[None, :] ** 2
    noise = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
    return np.fft.ifft2((k2 + 1e-4) ** -1.5 * noise).real.astype(np.float32)


def _auto_only(x, target, monkeypatch) -> bytes:
    with monkeypatch.context() as m:
        m.setattr(sz_codec, "PSNR_CDF97_RATES", (1.0, 0.0))  # an empty range: auto alone
        return tp.compress(x, codec="sz", psnr=target)


def test_the_wavelet_path_is_kept_where_it_takes_fewer_bytes(monkeypatch):
    x = _power_law_field()
    blob = tp.compress(x, codec="sz", psnr=40.0)
    alone = _auto_only(x, 40.0, monkeypatch)
    assert len(blob) < len(alone)
    assert tp.info(blob)["config"]["predictor"] == "cdf97"
    y = tp.decompress(blob)
    assert measure_psnr(x, y) >= 40.0
    assert tp.info(blob)["target"]["psnr_reached"] >= 40.0


@pytest.mark.parametrize("target", [40.0, 70.0])
def test_never_more_bytes_than_auto_alone_and_the_target_reached(monkeypatch, target):
    rng = np.random.default_rng(1)
    x = np.cumsum(rng.standard_normal((96, 96)), axis=1).astype(np.float32)
    blob = tp.compress(x, codec="sz", psnr=target)
    assert len(blob) <= len(_auto_only(x, target, monkeypatch))
    assert measure_psnr(x, tp.decompress(blob)) >= target


def test_only_auto_at_few_bits_per_value_has_an_alternative():
    auto = get_codec("sz")
    low, high = sz_codec.PSNR_CDF97_RATES
    (alt,) = auto.psnr_alternatives((low + high) / 2)
    assert alt.predictor == "cdf97"
    assert auto.psnr_alternatives(high * 2) == ()
    assert get_codec("sz", predictor="lorenzo").psnr_alternatives(low) == ()
    assert get_codec("block").psnr_alternatives(low) == ()
