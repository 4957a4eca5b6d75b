"""Small plain-PyTorch models for the trace corpus (no torchvision).

They follow the DTR paper's benchmark models at CPU-friendly sizes: the structure
(depth, branching, skip connections, recurrences, unrolling) is kept, widths and
inputs are shrunk so that one training step records in seconds and its trace has
hundreds to a few thousand operators.

``build(name, batch, seed)`` returns a :class:`Workload`: the module, its inputs and
the loss, ready for :func:`dtrlab.trace.record`.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Workload:
    module: nn.Module
    inputs: tuple
    loss_fn: Callable | None
    batch: int
    input_shape: str
    desc: str
    #: the user's function asked for CUDA (``model.cuda()``, ...): the step is a GPU's (models._CudaOnBuildDevice)
    built_for_cuda: bool = False


@dataclass(frozen=True)
class ZooModel:
    title: str
    default_batch: int
    make: Callable[[int], Workload]


def _classification(module: nn.Module, batch: int, shape: tuple[int, ...], classes: int, desc: str) -> Workload:
    x = torch.randn(batch, *shape)
    labels = torch.randint(0, classes, (batch,))
    return Workload(module, (x,), lambda logits: F.cross_entropy(logits, labels), batch,
                    "x".join(map(str, (batch, *shape))), desc)


# -- ResNet-32 (CIFAR-style, He et al. 2016) ----------------------------------------

class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet32(nn.Module):
    """3 stages of 5 basic blocks (16/32/64 channels): 31 convolutions and a linear layer."""

    def __init__(self, classes: int = 10, blocks_per_stage: int = 5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        layers, cin = [], 16
        for stage, cout in enumerate((16, 32, 64)):
            for block in range(blocks_per_stage):
                layers.append(_BasicBlock(cin, cout, 2 if stage > 0 and block == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# -- DenseNet (Huang et al. 2017) ----------------------------------------------------

class _DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int, bn_size: int):
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, 1, 1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, 1)
        x = self.conv1(F.relu(self.norm1(x)))
        return self.conv2(F.relu(self.norm2(x)))


class DenseNet(nn.Module):
    """Dense blocks with transitions (DenseNet-121: blocks 6/12/24/16); growth rate 12."""

    def __init__(self, blocks: tuple[int, ...] = (6, 12, 24, 16), growth: int = 12, bn_size: int = 4,
                 classes: int = 10):
        super().__init__()
        channels = 2 * growth
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, 1, 1, bias=False), nn.BatchNorm2d(channels), nn.ReLU())
        self.blocks, self.transitions = nn.ModuleList(), nn.ModuleList()
        for i, n_layers in enumerate(blocks):
            self.blocks.append(nn.ModuleList(_DenseLayer(channels + j * growth, growth, bn_size) for j in range(n_layers)))
            channels += n_layers * growth
            if i < len(blocks) - 1:
                self.transitions.append(nn.Sequential(
                    nn.BatchNorm2d(channels), nn.ReLU(), nn.Conv2d(channels, channels // 2, 1, bias=False),
                    nn.AvgPool2d(2)))
                channels //= 2
        self.norm = nn.BatchNorm2d(channels)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.stem(x)
        for i, block in enumerate(self.blocks):
            features = [x]
            for layer in block:
                features.append(layer(features))
            x = torch.cat(features, 1)
            if i < len(self.transitions):
                x = self.transitions[i](x)
        x = F.relu(self.norm(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# -- Transformer (encoder, Vaswani et al. 2017) --------------------------------------

class _EncoderLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ff1, self.ff2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = dropout

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
        attn = F.dropout(scores.softmax(-1), self.dropout, self.training)
        context = (attn @ v).transpose(1, 2).reshape(b, s, d)
        x = self.norm1(x + F.dropout(self.proj(context), self.dropout, self.training))
        hidden = F.dropout(F.relu(self.ff1(x)), self.dropout, self.training)
        return self.norm2(x + self.ff2(hidden))


class Transformer(nn.Module):
    """Token embedding + learned positions, post-norm encoder layers, language-model head."""

    def __init__(self, vocab: int = 1000, d_model: int = 128, heads: int = 4, d_ff: int = 512,
                 layers: int = 4, max_len: int = 512, dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        self.layers = nn.ModuleList(_EncoderLayer(d_model, heads, d_ff, dropout) for _ in range(layers))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


# -- U-Net (Ronneberger et al. 2015) -------------------------------------------------

def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    """Four down- and up-sampling levels with skip concatenations; per-pixel classes."""

    def __init__(self, cin: int = 3, classes: int = 2, base: int = 8, depth: int = 4):
        super().__init__()
        widths = [base * 2 ** i for i in range(depth + 1)]
        self.down = nn.ModuleList([_double_conv(cin, widths[0])] +
                                  [_double_conv(widths[i], widths[i + 1]) for i in range(depth)])
        self.up = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in reversed(range(depth)))
        self.up_conv = nn.ModuleList(_double_conv(2 * widths[i], widths[i]) for i in reversed(range(depth)))
        self.out = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x):
        skips = []
        for i, level in enumerate(self.down):
            x = level(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        skips.pop()
        for up, conv in zip(self.up, self.up_conv):
            x = conv(torch.cat([skips.pop(), up(x)], 1))
        return self.out(x)


# -- LSTM (an unrolled recurrence written cell by cell) ------------------------------

class LSTM(nn.Module):
    """One LSTM layer unrolled over the sequence, classifying from the last hidden state."""

    def __init__(self, input_size: int = 64, hidden: int = 128, classes: int = 10):
        super().__init__()
        self.hidden = hidden
        self.w_input = nn.Linear(input_size, 4 * hidden)
        self.w_hidden = nn.Linear(hidden, 4 * hidden, bias=False)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x):  # x: (seq, batch, input)
        h = x.new_zeros(x.shape[1], self.hidden)
        c = x.new_zeros(x.shape[1], self.hidden)
        for x_t in x:
            i, f, g, o = (self.w_input(x_t) + self.w_hidden(h)).chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return self.fc(h)


# -- TreeLSTM (binary N-ary Tree-LSTM, Tai et al. 2015): structure follows the input --

Tree = int | tuple["Tree", "Tree"]  # a leaf's row in the token tensor, or (left, right)


def random_tree(rng: random.Random, depth: int) -> Tree:
    """A random binary tree of at most ``depth`` levels: the shape is data, not code."""
    leaves = itertools.count()

    def grow(level: int) -> Tree:
        if level == 0 or (level < 4 and rng.random() < 0.3):
            return next(leaves)
        return grow(level - 1), grow(level - 1)

    return grow(depth)


class TreeLSTM(nn.Module):
    """Recursion over a binary tree: every internal node combines its two children."""

    def __init__(self, vocab: int = 100, hidden: int = 64, classes: int = 5):
        super().__init__()
        self.hidden = hidden
        self.embed = nn.Embedding(vocab, hidden)
        self.leaf = nn.Linear(hidden, 3 * hidden)  # i, o, u gates of a leaf
        self.node = nn.Linear(2 * hidden, 5 * hidden)  # i, o, u and one forget gate per child
        self.fc = nn.Linear(hidden, classes)

    def encode(self, tree: Tree, tokens: torch.Tensor):
        if isinstance(tree, int):
            i, o, u = self.leaf(self.embed(tokens[tree])).chunk(3, -1)
            c = torch.sigmoid(i) * torch.tanh(u)
            return torch.sigmoid(o) * torch.tanh(c), c
        (h_l, c_l), (h_r, c_r) = (self.encode(child, tokens) for child in tree)
        i, o, u, f_l, f_r = self.node(torch.cat([h_l, h_r], -1)).chunk(5, -1)
        c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f_l) * c_l + torch.sigmoid(f_r) * c_r
        return torch.sigmoid(o) * torch.tanh(c), c

    def forward(self, tokens, tree: Tree):  # tokens: (leaves, batch)
        h, _ = self.encode(tree, tokens)
        return self.fc(h)


def _tree_leaves(tree: Tree) -> int:
    return 1 if isinstance(tree, int) else _tree_leaves(tree[0]) + _tree_leaves(tree[1])


# -- Unrolled GAN (Metz et al. 2017) -------------------------------------------------

def _mlp_params(sizes: list[int]) -> nn.ParameterList:
    params = []
    for cin, cout in zip(sizes, sizes[1:]):
        params += [nn.Parameter(torch.randn(cout, cin) / cin ** 0.5), nn.Parameter(torch.zeros(cout))]
    return nn.ParameterList(params)


def _mlp(params, x):
    for j in range(0, len(params), 2):
        x = F.linear(x, params[j], params[j + 1])
        if j + 2 < len(params):
            x = F.leaky_relu(x, 0.2)
    return x


class UnrolledGAN(nn.Module):
    """Generator step through ``unroll`` differentiable SGD steps of the discriminator.

    The forward pass trains a copy of the discriminator for ``unroll`` steps with
    ``create_graph=True``, and the generator loss backpropagates through all of them.
    """

    def __init__(self, latent: int = 16, hidden: int = 128, data_dim: int = 2, unroll: int = 5, lr: float = 0.1):
        super().__init__()
        self.gen = _mlp_params([latent, hidden, hidden, data_dim])
        self.disc = _mlp_params([data_dim, hidden, hidden, 1])
        self.unroll, self.lr = unroll, lr

    def forward(self, z, real):
        fake = _mlp(self.gen, z)
        disc = list(self.disc)
        ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(z.shape[0], 1)
        for _ in range(self.unroll):
            d_loss = (F.binary_cross_entropy_with_logits(_mlp(disc, real), ones)
                      + F.binary_cross_entropy_with_logits(_mlp(disc, fake), zeros))
            grads = torch.autograd.grad(d_loss, disc, create_graph=True)
            disc = [p - self.lr * g for p, g in zip(disc, grads)]
        return F.binary_cross_entropy_with_logits(_mlp(disc, fake), torch.ones(z.shape[0], 1))


def _gaussian_ring(batch: int, modes: int = 8) -> torch.Tensor:
    """The unrolled-GAN paper's toy data: a ring of Gaussian modes."""
    angles = torch.randint(0, modes, (batch,)) * (2 * torch.pi / modes)
    return torch.stack([angles.cos(), angles.sin()], 1) * 2 + 0.02 * torch.randn(batch, 2)


# -- registry ------------------------------------------------------------------------

def _make_treelstm(batch: int) -> Workload:
    tree = random_tree(random.Random(0), depth=5)
    leaves = _tree_leaves(tree)
    tokens = torch.randint(0, 100, (leaves, batch))
    labels = torch.randint(0, 5, (batch,))
    module = TreeLSTM()
    # The tree is a Python structure, not a tensor: bind it so that inputs are tensors only.
    return Workload(_BoundTree(module, tree), (tokens,), lambda logits: F.cross_entropy(logits, labels), batch,
                    f"{leaves}x{batch} tokens", f"Random binary tree of depth 5 ({leaves} leaves), hidden 64")


class _BoundTree(nn.Module):
    def __init__(self, tree_lstm: TreeLSTM, tree: Tree):
        super().__init__()
        self.tree_lstm, self.tree = tree_lstm, tree

    def forward(self, tokens):
        return self.tree_lstm(tokens, self.tree)


MODELS: dict[str, ZooModel] = {
    "resnet32": ZooModel("ResNet-32", 8, lambda b: _classification(
        ResNet32(), b, (3, 32, 32), 10, "32x32, 3 stages x 5 basic blocks (16/32/64 channels)")),
    "densenet121": ZooModel("DenseNet-121", 4, lambda b: _classification(
        DenseNet(), b, (3, 32, 32), 10, "32x32, blocks 6/12/24/16, growth rate 12")),
    # DenseNet-121's shape at a third of its depth: its simulations take a second, not a minute.
    "densenet45": ZooModel("DenseNet-45", 4, lambda b: _classification(
        DenseNet((2, 4, 8, 6)), b, (3, 32, 32), 10, "32x32, blocks 2/4/8/6, growth rate 12")),
    "transformer": ZooModel("Transformer", 4, lambda b: _lm_workload(b, seq=64)),
    "unet": ZooModel("U-Net", 2, lambda b: _unet_workload(b)),
    "lstm": ZooModel("LSTM", 16, lambda b: _lstm_workload(b, seq=32)),
    "treelstm": ZooModel("TreeLSTM", 4, _make_treelstm),
    "unroll_gan": ZooModel("Unrolled GAN", 64, lambda b: _gan_workload(b)),
}


def _lm_workload(batch: int, seq: int) -> Workload:
    tokens = torch.randint(0, 1000, (batch, seq))
    targets = torch.randint(0, 1000, (batch, seq))
    return Workload(Transformer(), (tokens,), lambda logits: F.cross_entropy(logits.flatten(0, 1), targets.flatten()),
                    batch, f"{batch}x{seq} tokens", f"4 encoder layers, d_model 128, 4 heads, sequence {seq}")


def _unet_workload(batch: int) -> Workload:
    x = torch.randn(batch, 3, 64, 64)
    masks = torch.randint(0, 2, (batch, 64, 64))
    return Workload(UNet(), (x,), lambda logits: F.cross_entropy(logits, masks), batch, f"{batch}x3x64x64",
                    "64x64, 4 levels, 8 base channels")


def _lstm_workload(batch: int, seq: int) -> Workload:
    x = torch.randn(seq, batch, 64)
    labels = torch.randint(0, 10, (batch,))
    return Workload(LSTM(), (x,), lambda logits: F.cross_entropy(logits, labels), batch, f"{seq}x{batch}x64",
                    f"Input 64, hidden 128, sequence length {seq}")


def _gan_workload(batch: int) -> Workload:
    z, real = torch.randn(batch, 16), _gaussian_ring(batch)
    return Workload(UnrolledGAN(), (z, real), lambda loss: loss, batch, f"{batch}x16 latent, {batch}x2 data",
                    "5 unrolled discriminator steps, MLPs of width 128, 2-D ring of 8 Gaussians")


def build(name: str, batch: int | None = None, seed: int = 0) -> Workload:
    """Build zoo model ``name`` with its inputs; parameters and data come from ``seed``."""
    model = MODELS[name]
    torch.manual_seed(seed)
    return model.make(batch or model.default_batch)
