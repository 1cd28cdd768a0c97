"""Output for people and programs: tables, JSON, progress bars, and numbers as text."""

from __future__ import annotations

import json
import math
import re
import sys

import numpy as np


def fmt(value, spec: str = ".4g") -> str:
    """``value`` in ``spec``; ``-`` for None, ``inf``/``nan`` for those floats."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return format(value, spec)


def print_table(headers: list[str], rows: list[list], *, file=None) -> None:
    """Columns padded to their widest cell; numbers right-aligned, text left-aligned."""
    file = file or sys.stdout
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    number = re.compile(r"(inf|nan|[-+]?[\d.]+(e[-+]?\d+)?)(!| [kMG]?B)?|-")
    right = [
        bool(cells) and all(number.fullmatch(r[i]) for r in cells) for i in range(len(headers))
    ]

    def line(row):
        return "  ".join(
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right, strict=True)
        ).rstrip()

    print(line(headers), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for row in cells:
        print(line(row), file=file)


def emit_json(doc) -> None:
    """Print ``doc`` as one indented JSON document on stdout (numpy scalars as numbers)."""
    print(json.dumps(doc, indent=2, default=_json_default, allow_nan=False))


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (tuple, set)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def finite_or_none(x: float | None) -> float | None:
    """``x`` as a float, or None when it is None, inf or nan (JSON has no inf)."""
    return None if x is None or not math.isfinite(x) else float(x)


def bound_text(bound: dict | None, codec: dict | None = None) -> str:
    """A stored bound for a table: ``rel=0.001 (abs 0.0123)``, ``abs=0.5``; without one,
    what the codec config ``codec`` keeps: ``lossless``, ``4-bit quant, no bound``."""
    if not bound:
        return unbounded_text(codec)
    text = f"{bound['mode']}={bound['value']:g}"
    tol = bound.get("tolerance")
    if bound["mode"] == "rel" and tol is not None:
        text += f" (abs {tol:.4g})"
    return text


def unbounded_text(codec: dict | None) -> str:
    """What a codec config without an error bound keeps: ``lossless`` (zstd, or no config),
    else its bits (quant: ``4-bit quant, no bound``), never "lossless" for a lossy codec."""
    if not isinstance(codec, dict):
        return "lossless"
    from .. import get_codec

    try:
        c = get_codec(codec)
    except (ValueError, TypeError, KeyError, ArithmeticError):  # unknown or invalid: no more
        return "no bound"
    if not c.lossy:
        return "lossless"
    bits = getattr(c, "bits", None)
    return f"{bits}-bit {c.name}, no bound" if bits else f"lossy {c.name}, no bound"


def codec_text(codec) -> str:
    """The codec's name (its full config is in the --json output); ``copied`` if none."""
    if not codec:
        return "copied"
    return str(codec.get("id", "?")) if isinstance(codec, dict) else str(codec)


def size_text(nbytes: int) -> str:
    """Bytes for people: ``512 B``, ``12.3 kB``, ``4.56 MB``, ``1.07 GB`` (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def rate_text(nbytes: int, seconds: float) -> str:
    """MB/s (1e6 bytes per second), or ``-`` when too little was timed to say."""
    if seconds <= 0 or nbytes == 0:
        return "-"
    rate = nbytes / 1e6 / seconds
    return f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"


def json_safe(obj):
    """Replace inf/nan floats (not JSON) by None."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


class Progress:
    """A tqdm bar per dataset (bytes), on stderr; off with ``quiet`` or off a TTY."""

    def __init__(self, quiet: bool):
        self.disable = True if quiet else None  # None: tqdm turns itself off on a non-TTY
        self.bar = None
        self.name = None
        self.done = 0

    def __call__(self, name: str, done_bytes: int, total_bytes: int) -> None:
        if name != self.name or done_bytes == 0:
            self.close()
            from tqdm import tqdm

            self.name, self.done = name, 0
            self.bar = tqdm(
                total=total_bytes,
                desc=name,
                unit="B",
                unit_scale=True,
                unit_divisor=1000,
                file=sys.stderr,
                disable=self.disable,
                leave=False,
                dynamic_ncols=True,
            )
        self.bar.update(done_bytes - self.done)
        self.done = done_bytes

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
