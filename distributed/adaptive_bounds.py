"""Dual-level adaptive error bounds for the embedding all-to-all: per table, per step.

The rule (after Feng et al., SC'24, which adapts the bound per table and per
iteration):

* **Per table.** An error ``d`` in the pooled values (or the gradients) of table
  ``t`` moves the loss by about ``d * G_t`` to first order, ``G_t`` the mean
  |gradient of the loss with respect to table t's pooled values| (for a gradient
  error, through the update it causes). With a block codec's bytes growing like
  ``-log(bound)`` per value, minimising the bytes of ``n`` tables subject to a
  fixed total perturbation ``sum_t e_t G_t`` gives ``e_t G_t`` equal for every
  table (a Lagrange multiplier). So the bound a user gives (``abs`` ``e``, or
  ``rel`` ``r`` of each block's range ``S_t``) is redistributed to
  ``e_t = mean_s(S_s G_s) / G_t`` times ``e`` or ``r`` — the same first-order
  loss perturbation as the fixed bound, and never more bytes by Jensen's
  inequality. A table the loss hardly depends on gets a looser bound. The factor
  is clipped to ``[1/max_ratio, max_ratio]`` so no table loses its signal.
* **Per step.** Early in training the loss falls steeply and the weights move
  far each step, so a looser bound costs nothing measurable; as the loss
  flattens, errors start to matter. The bound is multiplied by
  ``f = 1 + (early - 1) * min(1, p / p_max)``, ``p`` the recent relative loss
  decrease (a fast minus a slow moving average of the loss, over the slow one),
  ``p_max`` the largest seen; ``f`` never grows back.

``S_t`` and ``G_t`` are moving averages of what this rank sends and receives;
the state (:meth:`AdaptiveBounds.state_dict`) is per rank. See
``benchmarks/dlrm.py`` for fixed against adaptive bounds.
"""

from __future__ import annotations

import math

import torch

from ..compress.bounds import ErrorBound

__all__ = ["AdaptiveBounds"]

DIRECTIONS = ("forward", "backward")


def _positive(name, v, low=0.0) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= low:
        raise ValueError(f"{name} must be a finite number > {low}, got {v!r}")
    return float(v)


class AdaptiveBounds:
    """Per-table and per-step multipliers of an all-to-all's bounds; see the module docstring.

    ``ntables``: tables of the all-to-all; ``max_ratio`` (> 1): the furthest a table's
    bound moves from the given one; ``early`` (>= 1): the step factor at the start;
    ``momentum``: of the per-table averages; ``fast`` / ``slow``: of the loss
    averages; ``warmup``: steps before the loss's progress is read.
    """

    def __init__(self, ntables: int, *, max_ratio=8.0, early=2.0, momentum=0.9,
                 fast=0.9, slow=0.99, warmup=20):  # fmt: skip
        if isinstance(ntables, bool) or not isinstance(ntables, int) or ntables < 0:
            raise ValueError(f"ntables must be an integer >= 0, got {ntables!r}")
        self.ntables = ntables
        self.max_ratio = _positive("max_ratio", max_ratio, 1.0)
        self.early = _positive("early", early, 0.0)
        if self.early < 1.0:
            raise ValueError(f"early must be >= 1, got {early!r}")
        for name, v in (("momentum", momentum), ("fast", fast), ("slow", slow)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                raise ValueError(f"{name} must be a number in [0, 1), got {v!r}")
        if not fast < slow:
            raise ValueError(f"fast ({fast}) must be below slow ({slow})")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
        self.momentum, self.fast, self.slow, self.warmup = momentum, fast, slow, warmup
        nan = torch.full((ntables,), math.nan, dtype=torch.float64)
        #: per direction: moving average of each table's block value range
        self.ranges = {d: nan.clone() for d in DIRECTIONS}
        #: moving average of each table's mean |gradient| (the sensitivity G_t)
        self.sensitivity = nan.clone()
        self.steps = 0
        self.loss_fast = self.loss_slow = math.nan
        self.progress_max = 0.0
        self.factor = self.early

    # -- statistics --------------------------------------------------------------------

    def _average(self, old: torch.Tensor, idx: torch.Tensor, new: torch.Tensor) -> None:
        prev = old[idx]
        mixed = self.momentum * prev + (1 - self.momentum) * new
        old[idx] = torch.where(torch.isnan(prev), new, mixed)

    @torch.no_grad()
    def observe(self, direction: str, tables, x: torch.Tensor) -> None:
        """Fold in ``x [rows, len(tables), dim]``: the values (``"forward"``) or the
        gradients (``"backward"``) of ``tables``."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        idx = torch.as_tensor(list(tables), dtype=torch.long)
        if idx.numel() == 0 or x.shape[0] == 0:
            return
        x = x.detach().to(torch.float64)
        flat = x.transpose(0, 1).reshape(idx.numel(), -1)
        finite = torch.where(torch.isfinite(flat), flat, 0.0)
        span = (finite.amax(1) - finite.amin(1)).cpu()
        self._average(self.ranges[direction], idx, span)
        if direction == "backward":
            self._average(self.sensitivity, idx, finite.abs().mean(1).cpu())

    def table_factor(self, direction: str, table: int, mode: str) -> float:
        """The per-table multiplier of a ``mode`` (``abs``/``rel``) bound: 1 until the
        table's statistics are known."""
        g = self.sensitivity
        s = self.ranges[direction] if mode == "rel" else torch.ones_like(g)
        weight = s * g
        known = ~torch.isnan(weight) & (g > 0)
        if not bool(known[table]):
            return 1.0
        mean = weight[known].mean()
        ratio = float(mean / weight[table])
        return min(max(ratio, 1.0 / self.max_ratio), self.max_ratio)

    def bound(self, direction: str, table: int, base: ErrorBound) -> ErrorBound:
        """``base`` (abs or rel) scaled by the table's and the step's factors."""
        scale = self.factor * self.table_factor(direction, table, base.mode)
        return ErrorBound(base.mode, base.value * scale)

    # -- the step level ------------------------------------------------------------------

    def step(self, loss) -> float:
        """Record this step's training loss (a number or a 0-d tensor) and return the
        step factor the next steps use."""
        loss = float(loss)
        if not math.isfinite(loss):
            return self.factor
        self.steps += 1
        if math.isnan(self.loss_fast):
            self.loss_fast = self.loss_slow = loss
        self.loss_fast = self.fast * self.loss_fast + (1 - self.fast) * loss
        self.loss_slow = self.slow * self.loss_slow + (1 - self.slow) * loss
        progress = max(0.0, (self.loss_slow - self.loss_fast) / max(abs(self.loss_slow), 1e-12))
        self.progress_max = max(self.progress_max, progress)
        if self.steps > self.warmup and self.progress_max > 0:
            target = 1.0 + (self.early - 1.0) * min(1.0, progress / self.progress_max)
            self.factor = min(self.factor, target)
        return self.factor

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "ntables": self.ntables,
            "ranges": {d: r.clone() for d, r in self.ranges.items()},
            "sensitivity": self.sensitivity.clone(),
            "steps": self.steps,
            "loss_fast": self.loss_fast,
            "loss_slow": self.loss_slow,
            "progress_max": self.progress_max,
            "factor": self.factor,
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("ntables") != self.ntables:
            raise ValueError(
                f"state is for {state.get('ntables')} tables, this AdaptiveBounds has "
                f"{self.ntables}"
            )
        self.ranges = {d: state["ranges"][d].clone().to(torch.float64) for d in DIRECTIONS}
        self.sensitivity = state["sensitivity"].clone().to(torch.float64)
        self.steps = int(state["steps"])
        self.loss_fast = float(state["loss_fast"])
        self.loss_slow = float(state["loss_slow"])
        self.progress_max = float(state["progress_max"])
        self.factor = float(state["factor"])
