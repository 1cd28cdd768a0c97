"""What a file's compression does with each dataset: the codec, the error bound (or PSNR
target) of every dataset and the HDF5 layout, checked before anything is written."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..compress.bounds import ErrorBound
from ..compress.registry import get_codec
from ..formats.hdf5 import is_scale

#: dtypes that are compressed; every other dataset is copied as it is
FLOAT_DTYPES = ("float16", "float32", "float64")


@dataclass(frozen=True)
class PsnrTarget:
    """A quality target in place of an error bound: ``psnr`` in dB over the finite value
    range (``compress/quality.py``); each dataset gets the loosest abs bound found to
    reach it."""

    psnr: float


def bound_of(spec, name: str) -> ErrorBound | PsnrTarget | None:
    """``spec`` as the plan holds it: an :class:`ErrorBound` or a :class:`PsnrTarget` as
    it is, a dict with one of "abs", "rel", "pw_rel", "psnr" converted (ValueError, named
    ``name``, says what is wrong), None as None. PSNR is a target the plan searches an
    abs bound for, not an ErrorBound mode."""
    if spec is None or isinstance(spec, (ErrorBound, PsnrTarget)):
        return spec
    if not isinstance(spec, dict):
        raise ValueError(
            f"{name} must be a dict with one of 'abs', 'rel', 'pw_rel', 'psnr', "
            f"e.g. {{'rel': 1e-3}}, or an ErrorBound; got {spec!r}"
        )
    unknown = set(spec) - {"abs", "rel", "pw_rel", "psnr"}
    if unknown:
        raise ValueError(
            f"{name}: unknown error-bound mode(s) {', '.join(map(repr, sorted(unknown)))}; "
            "use one of 'abs', 'rel', 'pw_rel', 'psnr'"
        )
    if "psnr" not in spec:
        return ErrorBound.from_kwargs(**spec)
    value = spec["psnr"]
    if len(spec) > 1:
        raise ValueError(f"{name}: give either psnr or one error bound, not both")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: psnr must be a finite number of dB, got {value!r}")
    return PsnrTarget(float(value))


#: how an HDF5 output stores a compressed dataset (see compress_file)
LAYOUTS = ("stream", "filter")


class Plan:
    """What a file's compression does, checked before writing: the codec, the error bound
    (or PSNR target) of every dataset, and how datasets are chunked: about
    ``chunk_bytes`` input bytes (None: the codec's default), or ``chunk_samples`` rows
    along the first axis for a compressed dataset (None: by bytes). The settings that
    ``compress_file`` and ``compress_to_zarr`` share."""

    #: store a dataset as it is when its stream would not be smaller
    raw_when_larger = False
    #: one of LAYOUTS
    layout = "stream"

    def __init__(
        self, codec, codec_options, bound, overrides, *, chunk_bytes=None, chunk_samples=None
    ):
        self.codec = get_codec(codec, **(codec_options or {}))
        if chunk_bytes is None:
            chunk_bytes = self.codec.default_chunk_bytes
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
        cs = chunk_samples
        if cs is not None and (isinstance(cs, bool) or not isinstance(cs, int) or cs < 1):
            raise ValueError(f"chunk_samples must be a positive integer (samples), got {cs!r}")
        #: input bytes per chunk, about
        self.chunk_bytes = chunk_bytes
        #: samples (rows along the first axis) per chunk of a compressed dataset, whole
        #: along the others; None: chunks of about ``chunk_bytes``
        self.chunk_samples = chunk_samples
        self.default = bound_of(bound, "bound")
        overrides = dict(overrides or {})
        self.overrides = {
            str(k).strip("/"): bound_of(v, f"override {k!r}") for k, v in overrides.items()
        }
        for b in [self.default, *self.overrides.values()]:
            if self.codec.bounded and b is None:
                raise ValueError(
                    f"codec {self.codec.name!r} needs an error bound: give a dict with one of "
                    "'abs', 'rel', 'pw_rel', e.g. {'rel': 1e-3}"
                )
            if isinstance(b, PsnrTarget):
                if not (self.codec.bounded and "abs" in self.codec.bound_modes):
                    raise ValueError(
                        f"codec {self.codec.name!r} takes no abs error bound, so no psnr target"
                    )
            else:
                self.codec.with_bound(b)  # refuses a bound the codec does not take

    def sample_rows(self, shape: tuple) -> int | None:
        """Rows per chunk of a compressed dataset of ``shape`` under ``chunk_samples``
        (at most its length); None when chunked by bytes or 0-d."""
        if self.chunk_samples is None or not shape:
            return None
        return max(1, min(self.chunk_samples, int(shape[0])))

    def check_names(self, names: list) -> None:
        """Every override must name a dataset (full path or last component)."""
        last = {n.rsplit("/", 1)[-1] for n in names}
        missing = [k for k in self.overrides if k not in names and k not in last]
        if missing:
            raise ValueError(
                f"override(s) {', '.join(map(repr, missing))} match no dataset; datasets: "
                f"{', '.join(names) or 'none'}"
            )

    def bound_for(self, name: str) -> ErrorBound | None:
        if name in self.overrides:
            return self.overrides[name]
        return self.overrides.get(name.rsplit("/", 1)[-1], self.default)

    def compresses(self, source) -> bool:
        """Whether a dataset of this dtype is compressed (floats; with a lossless codec
        integers too), else copied."""
        dtype = np.dtype(source.dtype)
        if dtype.kind in "iu" and not self.codec.lossy:
            return dtype.name in self.codec.dtypes
        if dtype.kind != "f" or dtype.name not in FLOAT_DTYPES:
            return False
        if dtype.name not in self.codec.dtypes:
            raise ValueError(
                f"codec {self.codec.name!r} does not accept {dtype.name} data; it takes "
                f"{', '.join(self.codec.dtypes)}: choose another codec"
            )
        return True

    def copy_reason(self, obj, regions=()) -> str:
        """Why HDF5 dataset ``obj`` is copied as it is, or "" when it is compressed."""
        if obj.shape is None:
            return "copied: a null dataspace holds no values"
        if is_scale(obj):
            return "copied: a dimension scale is kept exact"
        if obj.id in regions:
            return "copied: region references point into it"
        if self.layout == "filter" and obj.dtype.kind != "f" and self.compresses(obj):
            return f"copied: the HDF5 filter takes floats, not {obj.dtype} data"
        if not self.compresses(obj):
            if not self.codec.lossy:
                return f"copied: codec {self.codec.name} does not take {obj.dtype} data"
            return f"copied: {obj.dtype} data takes no error bound (floats are compressed)"
        return ""
