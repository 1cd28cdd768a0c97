"""Gradients of a model's mean squared output, with or without saved-tensor hooks: the
probe the activation-compression tests compare."""

from __future__ import annotations

import torch


def square_loss_grads(model, x, ac=None) -> torch.Tensor:
    """The gradients of ``model(x).square().mean()``, flat, with the forward pass under
    ``ac`` (an ``ActivationCompression``) if given."""
    model.zero_grad()
    if ac is None:
        model(x).square().mean().backward()
    else:
        with ac:
            loss = model(x).square().mean()
        loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])
