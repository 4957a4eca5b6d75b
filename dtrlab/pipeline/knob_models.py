"""Two-block versions of traces/models/' ViT-B/16 and DiT-XL/2 for the knob census (``dtrlab ship knob``).

``dtrlab capture`` sources (``dtrlab.pipeline.knob_models:vit_b_16_blocks``, ``...:dit_xl_2_blocks``) with the
published per-block shapes of torchvision's ViT-B/16 and diffusers' DiT-XL/2 (as dtrlab.trace.models builds
them) but two blocks deep: torch's partitioner takes a few seconds per knob on these graphs, far more on the
full depth. Random initialisation; the step is ``loss_fn(model(*inputs))``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..trace.models import ClassConditionalDenoiser


def vit_b_16_blocks(batch: int = 64):
    """ViT-B/16 at 224px (hidden 768, 12 heads, MLP 3072, patch 16), 2 encoder blocks; cross-entropy on 1000 classes."""
    from unittest import mock

    from torchvision.models import VisionTransformer

    # Its truncated-normal initialisation loops on data (mask.any()), which fake tensors cannot answer;
    # the values do not matter on them, so that one initialiser is skipped.
    with mock.patch("torch.nn.init.trunc_normal_", lambda tensor, *args, **kwargs: tensor):
        model = VisionTransformer(image_size=224, patch_size=16, num_layers=2, num_heads=12, hidden_dim=768,
                                  mlp_dim=3072)
    model.train()
    labels = torch.randint(0, 1000, (batch,))
    return model, torch.randn(batch, 3, 224, 224), lambda logits: F.cross_entropy(logits, labels)


def dit_xl_2_blocks(batch: int = 32):
    """DiT-XL/2 at 256px (width 1152, 16 heads of 72, patch 2 on 32x32x4 latents, adaLN-Zero), 2 blocks;
    MSE on the noise prediction."""
    import diffusers

    transformer = diffusers.DiTTransformer2DModel(
        num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8, num_layers=2,
        sample_size=32, patch_size=2, num_embeds_ada_norm=1000, norm_type="ada_norm_zero")
    transformer.train()
    noise = torch.randn(batch, 4, 32, 32)
    inputs = (torch.randn(batch, 4, 32, 32), torch.randint(0, 1000, (batch,)), torch.randint(0, 1000, (batch,)))
    return ClassConditionalDenoiser(transformer), inputs, lambda pred: F.mse_loss(pred[:, :4], noise)
