"""Small model sources for the activation-checkpointing comparison (``dtrlab ship ac``, tests/test_checkpointing.py).

``dtrlab capture`` sources of the same architecture as traces/models/' ViT-B/16 at toy size: what a
CPU can run for real in a test, and what the exact solvers can bracket.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def vit_tiny(batch: int = 4, layers: int = 4):
    """torchvision's VisionTransformer at 32px: patch 8 (16 patches), ``layers`` blocks of width 64, 4 heads,
    MLP 128; cross-entropy on 10 classes."""
    from unittest import mock

    from torchvision.models import VisionTransformer

    # As in dtrlab.pipeline.knob_models: its truncated-normal initialiser reads data, which meta tensors lack.
    with mock.patch("torch.nn.init.trunc_normal_", lambda tensor, *args, **kwargs: tensor):
        model = VisionTransformer(image_size=32, patch_size=8, num_layers=layers, num_heads=4, hidden_dim=64,
                                  mlp_dim=128, num_classes=10)
    model.train()
    labels = torch.randint(0, 10, (batch,))
    return model, torch.randn(batch, 3, 32, 32), lambda logits: F.cross_entropy(logits, labels)


def vit_tiny_l2(batch: int = 4):
    """:func:`vit_tiny` two blocks deep (what the exact solvers can bracket)."""
    return vit_tiny(batch, layers=2)


def resnet_small(batch: int = 16):
    """The zoo's CIFAR ResNet (dtrlab.trace.zoo.ResNet32) with 2 basic blocks per stage (ResNet-14, 6 blocks) on
    32x32 images; cross-entropy on 10 classes."""
    from ..trace.zoo import ResNet32

    labels = torch.randint(0, 10, (batch,))
    return ResNet32(blocks_per_stage=2), torch.randn(batch, 3, 32, 32), lambda logits: F.cross_entropy(logits, labels)


class ResidualMLP(torch.nn.Module):
    """``x + Linear(GELU(Linear(x)))``, hidden 4x the width: one block of :func:`mlp_blocks`."""

    def __init__(self, width: int):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x):
        return x + self.mlp(x)


def mlp_blocks(batch: int = 256):
    """Three residual MLP blocks of width 16 (about 100 operators: small enough for the solvers to bracket);
    the loss is the sum of the output."""
    return torch.nn.Sequential(*(ResidualMLP(16) for _ in range(3))), torch.randn(batch, 16), None
