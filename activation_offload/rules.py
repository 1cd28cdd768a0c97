"""Opt-in rules: saved tensors restored from other records instead of held.

The core (``hooks.py``) compresses every saved tensor it does not keep. A rule
recognises, by the names of the autograd nodes that made a tensor, an output that can
be computed again in backward from a record already held (``derived.py``,
``regions.py``), within the output's own bound, for fewer bytes. Rules read tensors
that autograd nodes save (``_saved_result1`` and the like), which are not a stable
torch API, so each lists the torch versions it was tested with; on another version a
rule is left out with a warning unless ``Rules(untested="use")``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .derived import (
    BATCH_NORM_NODE,
    GELU_NODE,
    LAYER_NORM_NODE,
    RELU_NODE,
    RESHAPES,
    BatchNormInputs,
    GeluInputs,
    LayerNormInputs,
)
from .regions import LOG_SOFTMAX_NODE, Regions


@dataclass(frozen=True)
class Rule:
    """One rule: ``nodes``, the autograd node names it derives outputs of (or reads);
    ``torch_versions``, the torch releases (major.minor) it was tested with; ``make``
    builds its per-context state."""

    name: str
    nodes: frozenset[str]
    torch_versions: tuple[str, ...]
    make: Callable[[], object]


#: every rule, by name, in the order the core tries them
RULES = {
    "gelu": Rule("gelu", frozenset({GELU_NODE}) | RESHAPES, ("2.13",), GeluInputs),
    "batch_norm": Rule(
        "batch_norm", frozenset({RELU_NODE, BATCH_NORM_NODE}), ("2.13",), BatchNormInputs
    ),
    "layer_norm": Rule(
        "layer_norm", frozenset({LAYER_NORM_NODE}) | RESHAPES, ("2.13",), LayerNormInputs
    ),
    "regions": Rule("regions", frozenset({LOG_SOFTMAX_NODE}), ("2.13",), Regions),
}
_UNTESTED = ("warn", "skip", "use")


@dataclass(frozen=True)
class Rules:
    """Which rules an :class:`ActivationCompression` uses (names from ``RULES``; ``()``:
    the core alone) and what to do on a torch version a rule was not tested with:
    ``"warn"`` leaves it out with a warning, ``"skip"`` leaves it out quietly, ``"use"``
    uses it anyway."""

    enabled: tuple[str, ...] = tuple(RULES)
    untested: str = "warn"

    def __post_init__(self):
        if isinstance(self.enabled, str):
            raise TypeError(f"Rules.enabled takes a tuple of rule names, got {self.enabled!r}")
        unknown = [r for r in self.enabled if r not in RULES]
        if unknown:
            raise ValueError(f"unknown rules {unknown}; rules: {', '.join(RULES)}")
        if self.untested not in _UNTESTED:
            raise ValueError(f"untested must be one of {_UNTESTED}, got {self.untested!r}")

    def active(self, version: str | None = None) -> list[Rule]:
        """The enabled rules to use on torch ``version`` (default: the running one), in
        ``RULES`` order."""
        release = ".".join((version or torch.__version__).split("+")[0].split(".")[:2])
        out = []
        for name, rule in RULES.items():
            if name not in self.enabled:
                continue
            if release not in rule.torch_versions and self.untested != "use":
                if self.untested == "warn":
                    warnings.warn(
                        f"activation rule {name!r} was tested with torch "
                        f"{', '.join(rule.torch_versions)}, not {release}: left out "
                        "(Rules(untested='use') keeps it)",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                continue
            out.append(rule)
        return out


#: every rule, with a warning for those not tested with the running torch
ALL_RULES = Rules()
