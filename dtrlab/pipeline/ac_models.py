"""Small model sources for the activation-checkpointing comparison (``dtrlab ship ac``, tests/test_checkpointing.py).

``dtrlab capture`` sources of the same architecture as traces/models/' ViT-B/16 at toy size: what a
CPU can run for real in a test, and what the exact solvers can bracket.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def vit_tiny(batch: int = 4):
    """torchvision's VisionTransformer at 32px: patch 8 (16 patches), 4 blocks of width 64, 4 heads, MLP 128;
    cross-entropy on 10 classes."""
    from unittest import mock

    from torchvision.models import VisionTransformer

    # As in dtrlab.pipeline.knob_models: its truncated-normal initialiser reads data, which meta tensors lack.
    with mock.patch("torch.nn.init.trunc_normal_", lambda tensor, *args, **kwargs: tensor):
        model = VisionTransformer(image_size=32, patch_size=8, num_layers=4, num_heads=4, hidden_dim=64,
                                  mlp_dim=128, num_classes=10)
    model.train()
    labels = torch.randint(0, 10, (batch,))
    return model, torch.randn(batch, 3, 32, 32), lambda logits: F.cross_entropy(logits, labels)
