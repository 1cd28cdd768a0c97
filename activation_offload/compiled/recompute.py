"""Saved tensors the backward can recompute from other saved tensors, pointwise.

The min-cut partitioner weighs saving a tensor against recomputing it in full-size
bytes; once the saved tensors are held as codes, a pointwise result of tensors that are
saved anyway (a GELU's output beside its input, a layer norm's output beside its input
and statistics) costs its whole size to hold and a few fused element operations to
recompute. So such a tensor is not saved at all: the backward applies the same ops to
the restored inputs just before its first use. Its error is then the ops' gain times
the inputs' errors (GELU's slope is at most 1.13; a norm's output moves by ``rstd *
weight`` times its input's error).
"""

from __future__ import annotations

import torch

#: most ops recomputed for one saved tensor
MAX_OPS = 8


def _replayable(node) -> bool:
    """A deterministic pointwise op or a view, whose other arguments are constants or
    nodes of the same graph."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    tags = node.target.tags
    if torch.Tag.nondeterministic_seeded in tags:
        return False
    return torch.Tag.pointwise in tags or node.target.is_view


def source(base, saved: set, skip: set):
    """The forward's ops that compute ``base`` from nodes in ``saved`` (not in ``skip``)
    through :func:`_replayable` ops, in graph order; None when there is none within
    :data:`MAX_OPS`."""
    ops, stack, seen = [], [base], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node is not base and node in saved:
            if node in skip:
                return None
            continue
        if not _replayable(node) or len(ops) == MAX_OPS:
            return None
        ops.append(node)
        stack.extend(node.all_input_nodes)
    order = {n: i for i, n in enumerate(base.graph.nodes)}
    return sorted(ops, key=order.__getitem__)


def replay(bw, ops: list, inputs: dict, before):
    """Copies of the forward's ``ops`` in ``bw`` before node ``before``, their saved
    inputs read from ``bw``'s placeholders (``inputs``, by name); the last op's copy."""
    env = {}
    with bw.graph.inserting_before(before):
        for op in ops:
            env[op] = bw.graph.node_copy(op, lambda n: env[n] if n in env else inputs[n.name])
    return env[ops[-1]]
