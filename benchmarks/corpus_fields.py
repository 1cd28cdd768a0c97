"""Synthetic scientific fields shaped like SDRBench's, for the benchmark corpus.

Each builder is deterministic (a fixed seed), takes a few seconds with numpy's FFT,
and returns ``{name: float32 array}``; ``corpus.py`` caches and lists them.

  turbulence_u    256^3 x-velocity of a solenoidal random field whose energy spectrum
                  follows Pope's model spectrum: k^4 at large scales, k^-5/3 inertial
                  range, exponential dissipation range resolved at k_max * eta = 1.5
                  (like a DNS snapshot, e.g. SDRBench's Miranda/JHTDB velocities)
  climate_t2m     1800x3600 (0.1 degree) surface-temperature-like field in kelvin: a
                  latitude gradient, planetary waves, mesoscale noise, sharp fronts and
                  coastlines (like SDRBench's CESM-ATM / Hurricane 2-d fields)
  interface_rho   192^3 two-phase density: a perturbed heavy-over-light interface with
                  bubbles and droplets, smooth interiors and a jump about one cell wide
                  (like SDRBench's Miranda density or a level-set material field)
  grf_2d          2048^2 Gaussian random field, power spectrum (4 + k^2)^-2 (k^-4: smooth,
                  with detail at every scale), held out from the fields the choice was
                  tuned on (like a 2-d slice of a cosmology or geostatistics field)
"""

from __future__ import annotations

import numpy as np


def _wavenumbers(shape: tuple[int, ...]) -> list[np.ndarray]:
    """Integer wavenumbers per axis of an ``rfftn`` grid, broadcastable (float32)."""
    ks = []
    for axis, n in enumerate(shape):
        k = np.fft.rfftfreq(n) * n if axis == len(shape) - 1 else np.fft.fftfreq(n) * n
        view = [1] * len(shape)
        view[axis] = k.size
        ks.append(k.astype(np.float32).reshape(view))
    return ks


def _complex_noise(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """White complex Gaussian noise in Fourier space (irfftn makes it real)."""
    noise = rng.standard_normal((*shape, 2), dtype=np.float32)
    return noise.view(np.complex64)[..., 0]


def _random_field(
    rng: np.random.Generator, shape: tuple[int, ...], slope: float, k0: float = 1.0
) -> np.ndarray:
    """Zero-mean, unit-std Gaussian random field with power spectrum (k0^2 + k^2)^(slope/2)."""
    ks = _wavenumbers(shape)
    k2 = sum(k * k for k in ks)
    spectrum_shape = np.broadcast_shapes(*(k.shape for k in ks))
    amplitude = (np.float32(k0 * k0) + k2) ** np.float32(slope / 4.0)
    amplitude.flat[0] = 0.0
    field = np.fft.irfftn(_complex_noise(rng, spectrum_shape) * amplitude, s=shape)
    field -= field.mean()
    field /= field.std()
    return field.astype(np.float32, copy=False)


def build_turbulence(n: int = 256) -> dict[str, np.ndarray]:
    """x-velocity of a divergence-free Gaussian field with a k^-5/3 inertial range."""
    rng = np.random.default_rng(5_3)
    kx, ky, kz = _wavenumbers((n, n, n))
    k2 = kx * kx + ky * ky + kz * kz
    k2.flat[0] = 1.0
    k = np.sqrt(k2)
    # Pope (2000), eq. 6.246: E(k) = k^-5/3 f_L(kL) f_eta(k eta), p0 = 2, beta = 5.2.
    big, eta = 0.6, 1.5 / (n // 2)
    f_l = (k * big / np.sqrt((k * big) ** 2 + np.float32(6.78))) ** np.float32(5 / 3 + 2)
    f_eta = np.exp(-5.2 * (((k * eta) ** 4 + np.float32(0.4**4)) ** 0.25 - np.float32(0.4)))
    energy = k ** np.float32(-5 / 3) * f_l * f_eta
    # A 3-d mode carries E(k) / (4 pi k^2): amplitude sqrt(E) / k.
    amplitude = (np.sqrt(energy) / k).astype(np.float32)
    amplitude.flat[0] = 0.0
    shape = k.shape
    wx, wy, wz = (_complex_noise(rng, shape) for _ in range(3))
    # Project out the longitudinal part (k . u = 0): u_x = w_x - k_x (k . w) / k^2.
    u_hat = wx - kx * ((kx * wx + ky * wy + kz * wz) / k2)
    del wx, wy, wz
    u_hat *= amplitude
    u = np.fft.irfftn(u_hat, s=(n, n, n))
    u -= u.mean()
    u /= u.std()
    return {"turbulence_u": u.astype(np.float32, copy=False)}


def _front(lat: np.ndarray, lat_front: np.ndarray, width: float) -> np.ndarray:
    """0 equatorward of ``lat_front`` (degrees), 1 poleward, across ``width`` degrees."""
    return 0.5 * (1.0 + np.tanh((np.abs(lat) - lat_front) / width))


def build_climate(n_lat: int = 1800, n_lon: int = 3600) -> dict[str, np.ndarray]:
    """2-m-temperature-like field on a regular 0.1 degree grid, in kelvin."""
    rng = np.random.default_rng(1800)
    lat = np.linspace(-90, 90, n_lat, endpoint=False, dtype=np.float32) + 90 / n_lat
    lon = np.linspace(0, 360, n_lon, endpoint=False, dtype=np.float32)
    phi, lam = np.deg2rad(lat)[:, None], np.deg2rad(lon)[None, :]
    t = 300.0 - 50.0 * np.sin(phi) ** 2 - 5.0 * np.sin(phi)  # pole-to-equator gradient
    for m in range(2, 8):  # planetary (Rossby) waves, strongest in mid-latitudes
        a, shift, tilt = rng.uniform(1.0, 4.0), rng.uniform(0, 2 * np.pi), rng.uniform(-2, 2)
        t = t + a * np.sin(2 * phi) ** 2 * np.cos(m * lam + shift + tilt * phi)
    t = t + 1.5 * _random_field(rng, (n_lat, n_lon), slope=-3.0, k0=4.0)  # weather noise
    # Polar fronts: a temperature drop poleward of a meandering front line 2 cells wide.
    for sign in (1.0, -1.0):
        meander = sum(
            rng.uniform(1.0, 4.0) * np.cos(m * lam + rng.uniform(0, 2 * np.pi)) for m in (3, 5, 9)
        )
        hemisphere = (np.sign(phi) == sign).astype(np.float32)
        t = t - 6.0 * hemisphere * _front(lat[:, None], 50.0 + meander, 0.2)
    # Land: colder, with orography; coastlines are sharp.
    relief = _random_field(rng, (n_lat, n_lon), slope=-3.5, k0=2.0)
    land = relief > 0.6
    t = t - land * (2.0 + 6.0 * np.clip(relief - 0.6, 0, None))
    return {"climate_t2m": np.asarray(t, dtype=np.float32)}


def build_interface(n: int = 192) -> dict[str, np.ndarray]:
    """Heavy fluid over light fluid after some mixing: density with sharp interfaces."""
    rng = np.random.default_rng(192)
    z = np.arange(n, dtype=np.float32)[:, None, None]
    # Signed level set in cells: a plane perturbed by smooth 3-d noise (mixing zone).
    phi = (z - n / 2) + 14.0 * _random_field(rng, (n, n, n), slope=-5.0, k0=3.0)
    for _ in range(24):  # bubbles of light fluid above, droplets of heavy fluid below
        c = rng.uniform(16, n - 16, size=3)
        r = rng.uniform(4, 14)
        lo = np.maximum(np.floor(c - r - 2).astype(int), 0)
        hi = np.minimum(np.ceil(c + r + 2).astype(int), n)
        box = tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))
        axes = np.ogrid[box]
        dist = np.sqrt(sum((g - ci) ** 2 for g, ci in zip(axes, c, strict=True))) - r
        dist = dist.astype(np.float32)
        if c[0] > n / 2:  # a light bubble in the heavy fluid: phi < 0 inside
            phi[box] = np.minimum(phi[box], dist)
        else:  # a heavy droplet in the light fluid: phi > 0 inside
            phi[box] = np.maximum(phi[box], -dist)
    heavy = 0.5 * (1.0 + np.tanh(phi / np.float32(0.7)))
    smooth = _random_field(rng, (n, n, n), slope=-6.0, k0=2.0)
    rho = 1.0 + 0.05 * smooth + heavy * (2.0 + 0.1 * smooth)  # light ~1, heavy ~3
    return {"interface_rho": rho.astype(np.float32)}


def build_grf_2d(n: int = 2048) -> dict[str, np.ndarray]:
    """Unit-std 2-d Gaussian random field with a k^-4 power spectrum (spectral synthesis)."""
    rng = np.random.default_rng(2048)
    return {"grf_2d": _random_field(rng, (n, n), slope=-4.0, k0=2.0)}
