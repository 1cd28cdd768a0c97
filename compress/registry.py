"""The one registry of codecs: the container, the CLI, zarr/numcodecs and the
activation hooks all find codecs here, by name or by config."""

from __future__ import annotations

from .bounds import MODES
from .codec import Codec

_REGISTRY: dict[str, type[Codec]] = {}


def register_codec(cls: type[Codec]) -> type[Codec]:
    """Class decorator: make ``cls`` findable by its ``name``."""
    if not cls.name:
        raise ValueError("a codec class needs a name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"codec name {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    return cls


def available_codecs() -> list[str]:
    """Names of the registered codecs, sorted."""
    return sorted(_REGISTRY)


def codec_class(name: str) -> type[Codec]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown codec {name!r}; available codecs: {', '.join(available_codecs())}"
        ) from None


def get_codec(spec: str | dict | Codec, **params) -> Codec:
    """A codec from a name (plus parameters), a config dict, or a codec instance.

    The parameters include the bound (``abs``/``rel``/``pw_rel``); those given as
    None are left out, so ``get_codec("sz", abs=None, rel=1e-3)`` is the sz codec
    under a rel bound of 1e-3.
    """
    params = {k: v for k, v in params.items() if not (k in MODES and v is None)}
    if isinstance(spec, Codec):
        if params:
            raise ValueError(
                "parameters cannot be given with a codec instance (its config holds them, "
                "its bound too)"
            )
        return spec
    if isinstance(spec, dict):
        if "id" not in spec:
            raise ValueError("a codec config needs an 'id' key naming the codec")
        return codec_class(spec["id"]).from_config({**spec, **params})
    if isinstance(spec, str):
        return codec_class(spec).from_config(params)
    raise TypeError(f"codec must be a name, a config dict or a Codec, got {type(spec).__name__}")
