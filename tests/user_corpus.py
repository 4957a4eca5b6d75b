"""User-style model sources (``module:function``), written as a user writes them: library models left
with their defaults, small sizes, configurations only (nothing downloaded). tests/test_user_corpus.py
runs each through ``dtrlab capture`` and ``dtrlab knob``."""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.nn import functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 256


class CausalLM(nn.Module):
    """A Hugging Face causal LM called as users call it, its defaults untouched (``use_cache`` on)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).logits


def _next_token_loss(ids):
    return lambda logits: F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def llama_defaults(batch: int = 2, seq: int = 32):
    """``LlamaForCausalLM`` from a small ``LlamaConfig`` with its defaults (``use_cache=True``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB)
    ids = torch.randint(0, VOCAB, (batch, seq))
    return CausalLM(LlamaForCausalLM(config)), ids, _next_token_loss(ids)


class Seq2Seq(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        return self.model(input_ids=ids, labels=labels).logits


def t5(batch: int = 2, seq: int = 32):
    """``T5ForConditionalGeneration`` (an encoder-decoder) trained on ``labels=`` (its decoder inputs shift them)."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                      decoder_start_token_id=0, pad_token_id=0)  # as t5-small's config.json sets them
    ids = torch.randint(0, VOCAB, (batch, seq))
    labels = torch.randint(0, VOCAB, (batch, seq))
    return (Seq2Seq(T5ForConditionalGeneration(config)), (ids, labels),
            lambda logits: F.cross_entropy(logits.flatten(0, 1), labels.flatten()))


class LabelsLoss(nn.Module):
    """A Hugging Face model trained with ``labels=``: the model computes its own loss (``.loss``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss


def gpt2_labels(batch: int = 2, seq: int = 32):
    """HF GPT-2 trained with ``labels=``: transformers' loss warns once, a graph break for torch.compile."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=max(seq, 64))
    return LabelsLoss(GPT2LMHeadModel(config)), torch.randint(0, VOCAB, (batch, seq)), None


def _image_classifier(module: nn.Module, batch: int, image: int):
    labels = torch.randint(0, 10, (batch,))
    return module, torch.randn(batch, 3, image, image), lambda logits: F.cross_entropy(logits, labels)


def timm_vit(batch: int = 2):
    """timm's ``vit_small_patch16_224`` at its own 224px, 10 classes."""
    import timm

    return _image_classifier(timm.create_model("vit_small_patch16_224", num_classes=10, depth=2), batch, 224)


def timm_convnext(batch: int = 2):
    """timm's ``convnext_atto`` (10 classes, 64px images)."""
    import timm

    return _image_classifier(timm.create_model("convnext_atto", num_classes=10), batch, 64)


def torchvision_vit(batch: int = 2):
    """torchvision's ViT-B/16 made small (2 layers, width 64) through its own constructor."""
    from torchvision.models.vision_transformer import VisionTransformer

    return _image_classifier(VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=4,
                                               hidden_dim=64, mlp_dim=128, num_classes=10), batch, 64)


class Checkpointed(nn.Module):
    """A model that calls ``torch.utils.checkpoint`` itself on each block."""

    def __init__(self, width: int = 64, blocks: int = 3):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                                    for _ in range(blocks))
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for block in self.blocks:
            x = x + torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def checkpointing(batch: int = 16):
    labels = torch.randint(0, 10, (batch,))
    return Checkpointed(), torch.randn(batch, 64), lambda logits: F.cross_entropy(logits, labels)


class Graphs2(nn.Module):
    """Two linear layers with a graph break between them (a print, as a user's logging does)."""

    def __init__(self, width: int = 64):
        super().__init__()
        self.first = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU())
        self.second = nn.Sequential(nn.Linear(4 * width, 4 * width), nn.GELU(), nn.Linear(4 * width, 10))

    def forward(self, x):
        h = self.first(x)
        torch._dynamo.graph_break()
        return self.second(h)


def graph_break(batch: int = 64):
    labels = torch.randint(0, 10, (batch,))
    return Graphs2(), torch.randn(batch, 64), lambda logits: F.cross_entropy(logits, labels)
