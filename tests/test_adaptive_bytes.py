"""Where ``Adaptive()`` saves bytes and where it cannot (docs/activations.md,
"Adaptive bounds"): its rule loosens the input of a layer with a weight, and a tensor
saved twice is held under the tighter of its bounds. A convolution after a max-pool is
the only saver of its input: that input is held under the learned, looser bound, in
fewer bytes, every restored tensor still within its bound (``debug=True`` checks each).
A convolution after BatchNorm and ReLU shares its input with the ReLU (or restores it
from the norm's input, held under the given bound): the bytes stay those of plain
``block`` although per-layer tolerances are learned."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tensorpress.activation_offload import ActivationCompression, Adaptive  # noqa: E402

nn = torch.nn
STEPS = 4


def pooled():
    """conv, ReLU, max-pool, conv, ...: each later conv alone saves its input."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, 10),
    )  # fmt: skip


def normed():
    """conv, BatchNorm, ReLU, conv, ...: each later conv's input is a ReLU's output."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip


def _train(make, **kw):
    """(stored bytes of each step, the compression) of a few SGD steps from seed 0."""
    torch.manual_seed(0)
    model = make()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    ac = ActivationCompression("block", rel=1e-2, model=model, min_bytes=0, debug=True, **kw)
    g = torch.Generator().manual_seed(1)
    stored = []
    for _ in range(STEPS):
        x = torch.randn(8, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (8,), generator=g)
        with ac:
            loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # debug: every restored tensor is checked against its bound
        optimizer.step()
        stored.append(ac.stats.stored_bytes)
    return stored, ac


def test_adaptive_holds_a_weighted_layers_own_input_in_fewer_bytes():
    plain, _ = _train(pooled)
    adaptive, ac = _train(pooled, adaptive=Adaptive())
    assert abs(adaptive[0] - plain[0]) <= 1e-3 * plain[0]  # step 0 learns, later steps use it
    assert all(a < 0.99 * p for a, p in zip(adaptive[1:], plain[1:], strict=True))
    rows = ac.stats.rows
    # the second conv ("3") alone saves the max-pool's output: held under a looser bound
    plain_rows = _train(pooled)[1].stats.rows
    assert rows["3"].stored_bytes < 0.8 * plain_rows["3"].stored_bytes
    assert rows["3"].tolerance > plain_rows["3"].tolerance


def test_adaptive_changes_no_bytes_where_another_saver_holds_the_input():
    """Only the inputs that a weighted layer alone saves may shrink (the first conv's,
    the data; the head's, the pooled features); every conv after a ReLU holds, and
    every other row, what plain ``block`` holds."""
    plain, plain_ac = _train(normed)
    adaptive, ac = _train(normed, adaptive=Adaptive())
    assert {"3", "6"} <= set(ac.bounds.tolerances)  # learned for the later convs
    alone = {"0", "11"}
    rows = {n: r.stored_bytes for n, r in ac.stats.rows.items() if n not in alone}
    assert rows == {n: r.stored_bytes for n, r in plain_ac.stats.rows.items() if n not in alone}
    assert all(abs(a - p) <= 1e-3 * p for a, p in zip(adaptive, plain, strict=True))
