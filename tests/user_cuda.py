"""A user's ``module:function`` sources that put their step on CUDA themselves, as a script for a GPU machine does
(issue 54 item 3): ``method`` by ``.cuda()``, ``moved`` by ``.to(device)`` and ``device=`` arguments, ``context``
under ``with torch.device("cuda")``; ``on_cpu`` is the same step left on the CPU."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def on_cpu(batch: int = 4):
    labels = torch.randint(0, 10, (batch,))
    return _model(), torch.randn(batch, 32), lambda logits: F.cross_entropy(logits, labels)


def method(batch: int = 4):
    labels = torch.randint(0, 10, (batch,)).cuda()
    return _model().cuda(), torch.randn(batch, 32).cuda(), lambda logits: F.cross_entropy(logits, labels)


def moved(batch: int = 4):
    device = torch.device("cuda")
    labels = torch.randint(0, 10, (batch,), device="cuda:0")
    return _model().to(device), torch.randn(batch, 32).to(device, torch.float32), \
        lambda logits: F.cross_entropy(logits, labels)


def context(batch: int = 4):
    with torch.device("cuda"):
        labels = torch.randint(0, 10, (batch,))
        return _model(), torch.randn(batch, 32), lambda logits: F.cross_entropy(logits, labels)
