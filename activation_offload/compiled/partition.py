"""A partitioner for inductor that holds a compiled graph's saved activations as codes.

Inductor splits the joint forward-backward graph into a forward graph, whose extra
outputs are the tensors saved for backward, and a backward graph that takes them as
inputs (``torch._functorch.partitioners.min_cut_rematerialization_partition``).
PyTorch's own activation quantization rewrites the two graphs right there (``_extract_
fwd_bwd_modules``: saved bf16 tensor -> float8 in the forward, -> bf16 in the backward);
this pass sits at the same place, as ``torch._inductor.config.custom_partitioner_fn``:
it runs the default partitioner, then for each chosen saved tensor ``t``

- forward: ``t``'s record is saved instead of ``t``;
- backward: ``t`` is restored from it just before its first use, so the restored
  tensor lives only from there on.

float32 tensors go through plain tensor ops traced into both graphs, which inductor
fuses into its own kernels (``graph_codes.py``); float16 and bfloat16 through the
custom ops ``tensorpress::saved_encode`` / ``saved_decode`` (``ops.py``). Either way a
record's size follows from the element count and the bound, so the graphs keep static
shapes and read nothing back. The saved list keeps its length and order, so AOTAutograd's runtime
wrappers are untouched.

Chosen: float16, bfloat16 and float32 activations of at least ``min_elements`` elements
whose memory is dense (no broadcast strides), that are neither graph inputs nor views of
them (parameters, the batch: held anyway), nor returned to the caller (held anyway), nor
made by a producer whose backward needs more than ``rel`` of the range (``KEEP``: a
log-softmax's log-probabilities, which a loss's gradient exponentiates). The bound: each
restored element within ``rel * (hi - lo)`` of the saved one, ``lo``/``hi`` the finite
min/max of that tensor (``device/codes.py`` says why). Before any of that, a saved tensor
that pointwise ops make from other saved tensors is dropped and recomputed in the
backward from their restored values (``recompute.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch._inductor.decomposition import select_decomp_table
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.fx.experimental.proxy_tensor import make_fx

from ..device.codes_layout import DTYPES, supports
from . import graph_codes, recompute
from . import ops as _ops  # noqa: F401  (registers tensorpress::saved_encode, saved_decode)

#: producers whose saved outputs are kept as they are (see the module docstring)
KEEP = frozenset(
    {
        torch.ops.aten._log_softmax.default,
        torch.ops.aten.log_softmax.int,
    }
)


@dataclass
class SavedBytes:
    """What the forward graphs compiled so far save for backward, in bytes.

    ``activations``: saved tensors that are not graph inputs or views of them, as the
    plain graph would hold them; ``held``: the same after encoding; ``inputs``: saved
    graph inputs (parameters, the batch) and their views, held anyway; ``encoded``: how
    many tensors were encoded; ``recomputed``: how many the backward recomputes from
    other saved tensors instead. Summed over the graphs (a recompile adds its own)."""

    activations: int = 0
    held: int = 0
    inputs: int = 0
    encoded: int = 0
    recomputed: int = 0
    graphs: list = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """Activation bytes over held bytes."""
        return self.activations / self.held if self.held else 1.0


def _tensor(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _view_chain(node):
    """(base, the view ops from base to ``node``): ``node`` seen through views whose
    other arguments are constants, so the backward can apply them again."""
    chain = []
    while node.op == "call_function" and getattr(node.target, "is_view", False):
        found = []
        torch.fx.node.map_arg((node.args[1:], node.kwargs), found.append)
        if found:
            break
        chain.append(node)
        node = node.args[0]
    return node, chain[::-1]


def _static(t: torch.Tensor) -> bool:
    return all(isinstance(s, int) for s in (*t.shape, *t.stride()))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size() if _static(t) else 0


def _feeds_exp(placeholder, depth: int = 4) -> bool:
    """Whether the backward exponentiates ``placeholder`` less a shift, through views and
    subtractions (a loss's softmax recomputed from its logits, ``exp(x - max - log)``):
    exp turns an absolute error into a relative one, so ``rel`` of the range would not
    bound the probabilities. (GELU's ``exp(-x * x / 2)`` goes through products, which
    shrink the error; it is not caught.)"""
    frontier = [placeholder]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            for user in n.users:
                if user.target is torch.ops.aten.exp.default:
                    return True
                if getattr(user.target, "is_view", False) or user.target in _SHIFTS:
                    nxt.append(user)
        frontier = nxt
    return False


_SHIFTS = frozenset({torch.ops.aten.sub.Tensor, torch.ops.aten.add.Tensor})


def choose(base, rel: float, min_elements: int, returned: set) -> bool:
    """Whether the saved tensor ``base`` (not a view) may be encoded (the rules in the
    module docstring, less the backward's exp)."""
    t = _tensor(base)
    if t is None or base in returned or base.op != "call_function" or base.target in KEEP:
        return False
    if getattr(base.target, "is_view", False):
        return False  # a view with tensor arguments: its base is unknown here
    if t.dtype not in DTYPES or not supports(t.dtype, rel) or not _static(t):
        return False
    return t.numel() >= min_elements and is_non_overlapping_and_dense_or_false(t)


def _set_val(node, val):
    node.meta["val"] = val
    node.meta["tensor_meta"] = torch.fx.passes.shape_prop._extract_tensor_metadata(val)


def in_graph(val: torch.Tensor, rel) -> bool:
    """Whether ``val`` is held by codes traced into the graphs (``graph_codes.py``),
    not by the custom ops: float32 under a bound of at most 8 bits a code."""
    return val.dtype == torch.float32 and graph_codes.supports(rel)


def _inline(graph, fn, args: list, before):
    """``fn`` of the nodes ``args`` traced into aten ops (inductor's decompositions) and
    copied into ``graph`` before node ``before``; the node of its result."""
    vals = [a.meta["val"] for a in args]
    with torch._guards.detect_fake_mode(vals):
        traced = make_fx(fn, decomposition_table=select_decomp_table())(*vals)
    env = {}
    placeholders = iter(args)
    with graph.inserting_before(before):
        for node in traced.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)
            elif node.op == "output":
                return env[node.args[0]]
            elif node.op == "call_function":
                env[node] = graph.node_copy(node, env.__getitem__)
            else:
                raise RuntimeError(f"tensorpress: cannot inline {node.op} {node.target}")
    raise AssertionError("a traced graph ends with its output")


def _empty_like(graph, record_val):
    with graph.inserting_before(graph.find_nodes(op="output")[0]):
        empty = graph.call_function(
            torch.ops.aten.empty.memory_format,
            ([0],),
            {"dtype": torch.uint8, "device": record_val.device},
        )
    _set_val(empty, record_val.new_empty(0))
    return empty


def _save_forward(fw, base, positions: list, rel):
    """The record of ``base`` (``rel`` None: nothing, recomputed) saved at
    ``positions[0]``, empty tensors at the others (the saved list keeps its length)."""
    graph = fw.graph
    saved = []
    if rel is not None and in_graph(base.meta["val"], rel):
        before = base.next
        saved.append(_inline(graph, lambda t: graph_codes.encode(t, rel), [base], before))
    elif rel is not None:
        op = torch.ops.tensorpress.saved_encode.default
        with graph.inserting_after(base):
            record = graph.call_function(op, (base, rel), name=f"tp_codes_{base.name}")
        _set_val(record, op(base.meta["val"], rel))
        saved.append(record)
    val = base.meta["val"].new_empty(0, dtype=torch.uint8)
    saved += [_empty_like(graph, val) for _ in positions[len(saved) :]]
    output = graph.find_nodes(op="output")[0]
    outs = list(output.args[0])
    for position, node in zip(positions, saved, strict=True):
        outs[position] = node
    output.update_arg(0, tuple(outs))
    return saved


def _restore_backward(bw, members: list, saved: list, make):
    """The backward's inputs for ``members`` ((placeholder, view chain) each) become
    ``saved``; ``make(first_record, before)`` rebuilds the base once, before the first
    use of any member, and each member is its view chain applied to it again."""
    graph = bw.graph
    new = []
    for (placeholder, _), node in zip(members, saved, strict=True):
        with graph.inserting_after(placeholder):
            new.append(graph.placeholder(node.name))
        new[-1].meta.update(node.meta)
    order = {n: i for i, n in enumerate(graph.nodes)}
    first = min((u for p, _ in members for u in p.users), key=order.__getitem__)
    restored = make(new[0], first)
    with graph.inserting_before(first):
        for placeholder, chain in members:
            current = restored
            for view in chain:
                current = graph.node_copy(view, lambda n, c=current: c)
            placeholder.replace_all_uses_with(current)
            graph.erase_node(placeholder)


def _decoder(bw, base_val, rel):
    """``make`` for :func:`_restore_backward`: ``saved_decode`` of the record."""

    def make(record, before):
        size, stride = list(base_val.shape), list(base_val.stride())
        if in_graph(base_val, rel):
            fn = lambda r: graph_codes.decode(r, size, stride, rel)  # noqa: E731
            return _inline(bw.graph, fn, [record], before)
        args = (record, size, stride, base_val.dtype, rel)
        op = torch.ops.tensorpress.saved_decode.default
        with bw.graph.inserting_before(before):
            restored = bw.graph.call_function(op, args)
        _set_val(restored, op(record.meta["val"], *args[1:]))
        return restored

    return make


def _producer(node) -> str:
    return str(node.target) if node.op == "call_function" else node.op


def _groups(outs, num_fwd_outputs: int) -> dict:
    """Saved tensors grouped by the tensor they view: base -> [(position, view chain)]."""
    groups: dict = {}
    for position in range(num_fwd_outputs, len(outs)):
        node = outs[position]
        if _tensor(node) is not None:
            base, chain = _view_chain(node)
            groups.setdefault(base, []).append((position, node, chain))
    return groups


def _encodable(base, members, inputs, rel, min_elements, returned) -> bool:
    if rel is None or not choose(base, rel, min_elements, returned):
        return False
    for _, node, _ in members:
        placeholder = inputs.get(node.name)
        if node in returned or placeholder is None or not placeholder.users:
            return False
        if _feeds_exp(placeholder):
            return False
    return True


def _recomputable(groups, saved: set, inputs, returned, min_elements) -> dict:
    """base -> the forward ops that recompute it from other saved tensors
    (``recompute.py``), for the saved tensors worth it."""
    chosen, leaves, skip = {}, set(), set()
    for base, members in groups.items():
        nodes = {base, *(node for _, node, _ in members)}
        t = _tensor(base)
        if base.op == "placeholder" or t is None or not _static(t) or nodes & leaves:
            continue
        if t.numel() < min_elements or any(n in returned for n in nodes):
            continue
        if any(not inputs.get(n.name) or not inputs[n.name].users for _, n, _ in members):
            continue
        ops = recompute.source(base, saved, skip)
        if ops is None:
            continue
        chosen[base] = ops
        skip |= nodes
        leaves |= {a for op in ops for a in op.all_input_nodes if a not in ops}
    return chosen


def encode_saved(fw, bw, num_fwd_outputs: int, rel, min_elements: int, into: SavedBytes):
    """Rewrite the partitioned ``fw`` and ``bw`` in place: each chosen saved tensor
    recomputed from others (``recompute.py``) or held as a record (``rel`` None: nothing
    changed, only counted). Bytes count each saved storage once (a tensor and its views
    share it). Adds to ``into``, and appends the graph's sums with its saved activations
    (name, producer, bytes saved, bytes held) to ``into.graphs``."""
    outs = fw.graph.find_nodes(op="output")[0].args[0]
    returned = set(outs[:num_fwd_outputs])
    inputs = {n.name: n for n in bw.graph.find_nodes(op="placeholder")}
    groups = _groups(outs, num_fwd_outputs)
    saved_nodes = {n for n in outs[num_fwd_outputs:] if isinstance(n, torch.fx.Node)}
    again = {}
    if rel is not None:
        again = _recomputable(groups, saved_nodes, inputs, returned, min_elements)
    for base, ops in again.items():  # first: replays read the saved inputs' placeholders
        members = groups[base]
        pairs = [(inputs[node.name], chain) for _, node, chain in members]
        saved = _save_forward(fw, base, [p for p, _, _ in members], None)
        _restore_backward(
            bw, pairs, saved, lambda _, at, o=ops: recompute.replay(bw, o, inputs, at)
        )
    graph = {"activations": 0, "held": 0, "inputs": 0, "encoded": 0, "recomputed": len(again)}
    tensors = []
    for base, members in groups.items():
        nbytes = _nbytes(_tensor(base)) if _tensor(base) is not None else 0
        if base.op == "placeholder":
            graph["inputs"] += nbytes
            continue
        held = 0 if base in again else nbytes
        if base not in again and _encodable(base, members, inputs, rel, min_elements, returned):
            pairs = [(inputs[node.name], chain) for _, node, chain in members]
            saved = _save_forward(fw, base, [p for p, _, _ in members], rel)
            _restore_backward(bw, pairs, saved, _decoder(bw, base.meta["val"], rel))
            held = sum(_nbytes(_tensor(n)) for n in saved)
            graph["encoded"] += 1
        graph["activations"] += nbytes
        graph["held"] += held
        tensors.append((base.name, _producer(base), nbytes, held))
    for key, value in graph.items():
        setattr(into, key, getattr(into, key) + value)
    into.graphs.append({**graph, "tensors": tensors})
    fw.recompile()
    bw.recompile()
