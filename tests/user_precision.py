"""A user's ``module:function`` source that sets its model's precision itself (issue 54 item 6):
``bf16``/``half`` cast the model ``plain`` returns, as a user casts before training."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.out = nn.Linear(32, 64)

    def forward(self, ids):
        return self.out(torch.relu(self.embed(ids)))


def plain(batch: int = 2, seq: int = 8):
    ids = torch.randint(0, 64, (batch, seq))
    return Tiny(), ids, lambda logits: F.cross_entropy(logits.flatten(0, 1), ids.flatten())


def bf16(batch: int = 2, seq: int = 8):
    model, ids, loss = plain(batch, seq)
    return model.to(torch.bfloat16), ids, loss


def half(batch: int = 2, seq: int = 8):
    model, ids, loss = plain(batch, seq)
    return model.half(), ids, loss
