"""Bytes-to-bytes stages: what runs on a codec's chunk payloads after the codec.

A stream is one array-to-bytes codec followed by zero or more stages, as in zarr 3's
codec pipeline: ``get_codec({"id": "block", "abs": 1e-3, "stages": [{"id": "zstd"}]})``
compresses each chunk with ``block`` and its payload with zstd; decoding runs the
stages in reverse, then the codec. A stage's config is its whole identity, as a
codec's is. The one stage today is zstd (``compress/zstd.py``, beside the frames every
zstd in tensorpress writes); a stage registers itself with :func:`register_stage`.
"""

from __future__ import annotations

import abc
from typing import ClassVar

_STAGES: dict[str, type[Stage]] = {}


class Stage(abc.ABC):
    """A bytes-to-bytes transform of chunk payloads; subclasses set ``name``."""

    name: ClassVar[str] = ""

    def parameters(self) -> dict:
        """The stage's own parameters (JSON values), without its id."""
        return {}

    def get_config(self) -> dict:
        return {"id": self.name, **self.parameters()}

    @abc.abstractmethod
    def encode(self, data) -> bytes:
        """The bytes-like ``data`` transformed."""

    @abc.abstractmethod
    def decode(self, data, max_size: int) -> bytes:
        """Inverse of :meth:`encode`; refuses output larger than ``max_size`` bytes."""

    def __eq__(self, other):
        return type(other) is type(self) and other.get_config() == self.get_config()

    def __hash__(self):
        return hash(repr(sorted(self.get_config().items())))

    def __repr__(self):
        params = ", ".join(f"{k}={v!r}" for k, v in self.parameters().items())
        return f"{type(self).__name__}({params})"


def register_stage(cls: type[Stage]) -> type[Stage]:
    """Class decorator: make ``cls`` findable by its ``name``."""
    if not cls.name or _STAGES.get(cls.name, cls) is not cls:
        raise ValueError(f"stage name {cls.name!r} is empty or already registered")
    _STAGES[cls.name] = cls
    return cls


def get_stage(spec) -> Stage:
    """A stage from a name, a config dict or a stage instance."""
    if isinstance(spec, Stage):
        return spec
    if isinstance(spec, str):
        spec = {"id": spec}
    if not isinstance(spec, dict) or spec.get("id") not in _STAGES:
        raise ValueError(
            f"unknown stage {spec!r}; a stage is one of {sorted(_STAGES)} (a name or a "
            "config dict such as {'id': 'zstd', 'level': 3})"
        )
    params = {k: v for k, v in spec.items() if k != "id"}
    try:
        return _STAGES[spec["id"]](**params)
    except TypeError as exc:
        raise ValueError(f"invalid config for stage {spec['id']!r}: {exc}") from None
