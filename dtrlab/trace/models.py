"""Model sources for ``dtrlab capture``: today's models from configurations, no weights.

A source names a model and how to build it; :func:`build` returns a
:class:`~dtrlab.trace.zoo.Workload` (module, inputs, loss) built on the meta device
by default, so that recording a billion-parameter training step needs no memory
for its tensors. Nothing is downloaded: parameters are initialised at random from a
configuration written here (``HF_HUB_OFFLINE=1`` is set before transformers is
imported).

* ``resnet32``, ``transformer``, ...: the small models of :mod:`dtrlab.trace.zoo`.
* ``torchvision:NAME``: ``torchvision.models.get_model(NAME, weights=None)``, e.g.
  ``torchvision:resnet50``, ``torchvision:vit_b_16``; images of ``--image`` pixels,
  cross-entropy over 1000 classes.
* ``hf:NAME``: a Hugging Face transformers model from a configuration preset:
  ``hf:gpt2`` (small), ``hf:gpt2-medium``, ``hf:gpt2-large``, ``hf:gpt2-xl``
  (causal LM loss), ``hf:bert-base``, ``hf:bert-large`` (masked LM loss on every
  token), ``hf:llama`` (a Llama-style decoder; by default Llama 3.2 1B's shape),
  ``hf:olmoe`` (a mixture-of-experts decoder with OLMoE-1B-7B's shape: 64 experts,
  8 active per token, run as transformers' ``grouped_mm`` experts, the kernel GPU
  training uses). ``layers``, ``hidden``, ``heads``, ``kv_heads``, ``intermediate``
  and ``vocab`` override the preset's sizes.
* ``diffusers:sd-unet``: Stable Diffusion 1.x's denoising U-Net
  (``UNet2DConditionModel``, 64x64x4 latents, 77 text tokens of width 768), noise
  prediction MSE loss.
* ``diffusers:dit-xl-2``: the diffusion transformer DiT-XL/2 (``DiTTransformer2DModel``,
  28 blocks of width 1152, patch 2, class-conditional; 256px images as 32x32x4
  latents), MSE of its noise prediction (the first 4 of its 8 output channels; DiT's
  variance term is left out).
* ``package.module:function``: a user's own; ``function(batch=..., seq=...)``
  (each passed only if given and accepted) returns ``(model, inputs, loss_fn)``;
  ``inputs`` is a tensor or a tuple of positional arguments, ``loss_fn`` maps the
  output to the loss (None: the sum of the outputs). It should create its tensors
  without naming a device, so that the default device (meta) applies.

On the meta device ``scaled_dot_product_attention`` would take its math path (the
whole attention matrix); during :func:`build`'s recording it runs the CPU flash
attention kernel instead, which is what it runs on real CPU tensors and what GPU
training runs (a flash kernel that saves only the log-sum-exp).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import zoo
from .sizes import SIZE_KEYS
from .sources import SCHEMES, ModelSourceError, check_source, describe_sources
from .zoo import Workload


@dataclass(frozen=True)
class HFPreset:
    kind: str  # "causal" or "masked"
    config: Callable[[], object]  # -> a transformers config
    default_seq: int
    default_batch: int
    title: str


def _gpt2(**sizes):
    from transformers import GPT2Config
    return lambda: GPT2Config(**sizes)


def _bert(**sizes):
    from transformers import BertConfig
    return lambda: BertConfig(**sizes)


def _llama():
    from transformers import LlamaConfig
    # Llama 3.2 1B's published shape (16 layers, width 2048, 32 heads, 8 KV heads).
    return lambda: LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                               max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True)


def _olmoe():
    from transformers import OlmoeConfig
    # OLMoE-1B-7B's published shape (transformers' defaults): 16 layers, width 2048, 16 heads,
    # 64 experts of width 1024 with 8 active per token, vocab 50304; 6.9B parameters.
    return lambda: OlmoeConfig(hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
                               num_attention_heads=16, num_key_value_heads=16, num_experts=64,
                               num_experts_per_tok=8, vocab_size=50304, max_position_embeddings=4096)


def _hf_presets() -> dict[str, HFPreset]:
    return {
        "gpt2": HFPreset("causal", _gpt2(), 1024, 8, "GPT-2 small"),
        "gpt2-medium": HFPreset("causal", _gpt2(n_embd=1024, n_layer=24, n_head=16), 1024, 8, "GPT-2 medium"),
        "gpt2-large": HFPreset("causal", _gpt2(n_embd=1280, n_layer=36, n_head=20), 1024, 8, "GPT-2 large"),
        "gpt2-xl": HFPreset("causal", _gpt2(n_embd=1600, n_layer=48, n_head=25), 1024, 8, "GPT-2 XL"),
        "bert-base": HFPreset("masked", _bert(), 512, 32, "BERT-base"),
        "bert-large": HFPreset("masked", _bert(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                               intermediate_size=4096), 512, 32, "BERT-large"),
        "llama": HFPreset("causal", _llama(), 2048, 4, "Llama-style decoder"),
        "olmoe": HFPreset("causal", _olmoe(), 4096, 2, "OLMoE-1B-7B-shaped MoE decoder"),
    }


#: Sources whose kernels take 16-bit floats only: why.
SIXTEEN_BIT_ONLY = {"hf:olmoe": "its experts run as grouped matmuls (aten._grouped_mm), which take bfloat16 or "
                                "float16 only; add --dtype bfloat16"}


def build(source: str, *, batch: int | None = None, seq: int | None = None, image: int = 224,
          device: str = "meta", dtype: torch.dtype | None = None, seed: int = 0, fake: bool = False,
          autocast: torch.dtype | None = None, **sizes) -> Workload:
    """Build ``source``'s training step on ``device`` ("meta": no data; "cpu": real tensors).

    ``dtype``: cast the parameters, buffers and floating inputs. ``autocast``: keep them
    (float32 master weights) and run the forward and the loss under
    ``torch.autocast(device_type, autocast)`` (:class:`Autocast`).
    ``fake``: the caller builds under a ``FakeTensorMode`` (see :func:`fake_build`)."""
    check_source(source)
    sizes = {key: value for key, value in sizes.items() if value is not None}
    unknown = set(sizes) - set(SIZE_KEYS)
    if unknown:
        raise ModelSourceError(f"{source}: unknown size settings {sorted(unknown)}; known: {', '.join(SIZE_KEYS)}")
    scheme, _, name = source.partition(":")
    check_precision(dtype, autocast)
    if source in SIXTEEN_BIT_ONLY and dtype not in (torch.bfloat16, torch.float16):
        raise ModelSourceError(f"{source}: {SIXTEEN_BIT_ONLY[source]}")
    if sizes and scheme != "hf":
        raise ModelSourceError(f"{source}: {', '.join(sorted(sizes))} apply to hf: models only")
    user_function = _user_function(source)
    torch.manual_seed(seed)
    with torch.device(device), (fake_build() if fake else contextlib.nullcontext()):
        if not name:
            workload = zoo.build(source, batch=batch, seed=seed)
        elif scheme == "torchvision":
            workload = _torchvision(name, batch or 64, image)
        elif scheme == "hf":
            workload = _huggingface(name, batch, seq, sizes)
        elif scheme == "diffusers":
            workload = _diffusers(name, batch)
        else:
            workload = _user_workload(source, user_function, batch, seq)
        if dtype is not None:
            cast_floating(workload.module, dtype)
            workload.inputs = tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                                    for t in workload.inputs)
    if autocast is not None:
        workload.module = Autocast(workload.module, autocast)
        workload.loss_fn = workload.module.wrap_loss(workload.loss_fn)
        workload.desc += f"; forward and loss under torch.autocast({str(autocast).removeprefix('torch.')})"
    return workload


@contextlib.contextmanager
def fake_workload(source: str, *, device: str = "cpu", **options) -> Iterator[Workload]:
    """``source`` built on fake tensors claiming ``device`` (no data, no memory), inside the fake mode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _user_function(source)  # imported outside the fake mode
    with FakeTensorMode(allow_non_fake_inputs=True):
        workload = build(source, device=device, fake=True, **options)
        if any(t.is_meta for t in (*workload.module.parameters(), *workload.module.buffers())):
            # A library that makes some tensors on the meta device itself (transformers' rotary
            # frequencies): fake tensors on the device like the rest (values never matter here).
            workload.module.to_empty(device=device)
        yield workload


AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


def check_precision(dtype: torch.dtype | None, autocast: torch.dtype | None) -> None:
    """One-line ValueErrors for a precision setting that cannot apply."""
    if autocast is not None and autocast not in AUTOCAST_DTYPES:
        raise ModelSourceError(f"autocast takes bfloat16 or float16, got {autocast}")
    if autocast is not None and dtype not in (None, torch.float32):
        raise ModelSourceError("--autocast keeps float32 master weights: drop --dtype (or use --dtype alone)")


class Autocast(nn.Module):
    """A model whose forward runs under ``torch.autocast`` on its parameters' device type, as AMP
    training runs it (float32 weights; operators on autocast's lower-precision list run in ``dtype``)."""

    def __init__(self, module: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.module = module
        self.dtype = dtype

    def device_type(self, inputs) -> str:
        tensors = [*self.module.parameters(), *(t for t in inputs if isinstance(t, torch.Tensor))]
        return tensors[0].device.type if tensors else "cpu"

    def forward(self, *inputs):
        with torch.autocast(self.device_type(inputs), dtype=self.dtype):
            return self.module(*inputs)

    def wrap_loss(self, loss_fn):
        """The loss under autocast too (PyTorch's AMP recipe runs model and loss in the region).
        None stays None (the step sums the outputs)."""
        if loss_fn is None:
            return None

        def loss(output):
            with torch.autocast(self.device_type(()), dtype=self.dtype):
                return loss_fn(output)
        return loss


def cast_floating(module: nn.Module, dtype: torch.dtype) -> None:
    """``module.to(dtype)`` by replacing each floating parameter and buffer (tied ones stay tied).

    ``Module.to`` swaps a fake tensor's contents in place (``torch.utils.swap_tensors``,
    torch/nn/modules/module.py:969-988), which fails on the fake tensors
    :func:`dtrlab.trace.torch_compile.tracing.trace_joint` builds with; replacing the module's entries
    is what ``Module.to`` does with ``torch.__future__.set_overwrite_module_params_on_conversion``.
    """
    cast: dict[int, torch.Tensor] = {}

    def converted(tensor, parameter: bool):
        if id(tensor) not in cast:
            value = tensor.detach().to(dtype)
            cast[id(tensor)] = nn.Parameter(value, requires_grad=tensor.requires_grad) if parameter else value
        return cast[id(tensor)]

    with torch.no_grad():
        for sub in module.modules():
            for table, parameter in ((sub._parameters, True), (sub._buffers, False)):
                for key, tensor in table.items():
                    if tensor is not None and tensor.is_floating_point():
                        table[key] = converted(tensor, parameter)


@contextlib.contextmanager
def meta_patches() -> Iterator[None]:
    """What a training step on meta tensors needs to run the kernels it runs on CPU tensors.

    * ``F.scaled_dot_product_attention`` runs the CPU flash kernel (not the math path), on
      meta tensors and on the fake CPU tensors of a capture under autocast, unless its mask
      needs a gradient (the flash kernel cannot give it; the math path, as on the CPU);
    * transformers' check for packed sequences (``find_packed_sequence_indices``) reads
      data (``.all()``); it computes the same tensors here and answers "not packed",
      which is what real data answers for the token positions 0..seq-1 that
      :func:`build`'s inputs have.
    """
    with _flash_attention_on_meta(), _unpacked_sequences():
        yield


@contextlib.contextmanager
def _unpacked_sequences() -> Iterator[None]:
    import sys

    masking = sys.modules.get("transformers.masking_utils")
    if masking is None or not hasattr(masking, "find_packed_sequence_indices"):
        yield
        return
    original = masking.find_packed_sequence_indices

    def find_packed_sequence_indices(position_ids):
        if position_ids.device.type != "meta":
            return original(position_ids)
        # transformers' own operations, up to the data-dependent test
        first_dummy_value = position_ids[:, :1] - 1
        position_diff = torch.diff(position_ids, prepend=first_dummy_value, dim=-1)
        packed_sequence_mask = (position_diff != 1).cumsum(-1)
        (packed_sequence_mask[:, -1] == 0).all()  # converting this to a bool is what meta tensors cannot do
        return None

    masking.find_packed_sequence_indices = find_packed_sequence_indices
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


@contextlib.contextmanager
def fake_build() -> Iterator[None]:
    """Building a model on fake tensors, whose initial values never matter (``trace_joint``).

    * ``torch.nn.init``'s initialisers leave a fake tensor as it is: some read its data
      (``trunc_normal_``'s rejection loop, torch/nn/init.py:111-121), which fake tensors cannot;
    * a factory call that names the CPU device itself (timm's drop-path rates:
      ``torch.linspace(..., device="cpu")`` then ``.item()``) makes a real CPU tensor, and
      calls on real CPU tensors only stay real, as when a model is built on the meta device
      for ``dtrlab capture``;
    * a user's own cast (``model.to(torch.bfloat16)``, ``.half()``) works: ``Module._apply`` swaps a
      fake parameter's contents with its cast (torch/nn/modules/module.py:969-988), and
      ``torch.utils.swap_tensors`` refuses a tensor with a weak reference (torch/utils/__init__.py:43-47),
      which every fake tensor has: the fake mode's memo (torch/_subclasses/fake_tensor.py:701, a
      ``WeakValueDictionary``, torch/_subclasses/meta_utils.py:921-923). :func:`_swappable_fakes`.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    init = torch.nn.init
    originals = {name: getattr(init, name) for name in dir(init)
                 if name.endswith("_") and not name.startswith("_") and callable(getattr(init, name))}

    def skipped(function):
        def initialiser(tensor, *args, **kwargs):
            return tensor if isinstance(tensor, FakeTensor) else function(tensor, *args, **kwargs)
        return initialiser

    for name, function in originals.items():
        setattr(init, name, skipped(function))
    try:
        with _RealCpuFactories(), _swappable_fakes():
            yield
    finally:
        for name, function in originals.items():
            setattr(init, name, function)


@contextlib.contextmanager
def _swappable_fakes() -> Iterator[None]:
    """``torch.utils.swap_tensors`` that first drops the fake mode's memo entries of the two tensors. The memo
    maps the meta tensor an operator returned to its fake tensor (``from_meta_and_device``,
    torch/_subclasses/fake_tensor.py:684-702); that meta tensor is never converted again, and after the swap the
    entry would name the other tensor's contents."""
    import weakref

    from torch._subclasses.fake_tensor import FakeTensor

    original = torch.utils.swap_tensors

    def swap_tensors(t1, t2):
        for tensor in (t1, t2):
            if isinstance(tensor, FakeTensor):
                memo = tensor.fake_mode.fake_tensor_converter.tensor_memo
                keys = [ref.key for ref in weakref.getweakrefs(tensor) if isinstance(ref, weakref.KeyedRef)]
                for key in keys:
                    if memo.get(key) is tensor:
                        del memo[key]
        return original(t1, t2)

    torch.utils.swap_tensors = swap_tensors
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


class _RealCpuFactories(torch.overrides.TorchFunctionMode):
    """Explicit-CPU factories, and calls on the real tensors they make, run outside the fake mode."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

        kwargs = kwargs or {}
        device = kwargs.get("device")
        tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        explicit_cpu = func in _FACTORIES and device is not None and torch.device(device).type == "cpu"
        if explicit_cpu or (tensors and not any(isinstance(t, FakeTensor) or t.device.type != "cpu"
                                                for t in tensors)):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


_FACTORIES = {torch.linspace, torch.arange, torch.logspace}


def _without_data(tensor: torch.Tensor) -> bool:
    """A meta tensor, or a fake CPU tensor (a capture under autocast): torch's own selector would answer math."""
    from torch._subclasses.fake_tensor import FakeTensor

    return tensor.device.type == "meta" or (isinstance(tensor, FakeTensor) and tensor.device.type == "cpu")


@contextlib.contextmanager
def _flash_attention_on_meta() -> Iterator[None]:
    original = F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if not _without_data(query) or (attn_mask is not None and attn_mask.requires_grad):
            # The CPU flash kernel is not differentiable with respect to a mask (T5's learned position
            # bias): torch's CPU selector (torch._fused_sdp_choice on CPU tensors) answers the math path
            # then, which the meta kernels run too. (A GPU would run memory-efficient attention.)
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)
        # The CPU flash kernel takes grouped-query attention's fewer key/value heads as they are.
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


# -- sources -------------------------------------------------------------------------

def _import(package: str, source: str, extra: str = "models"):
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise ModelSourceError(f"{source}: needs {package} ({exc}); pip install 'dtrlab[{extra}]'") from None


def _torchvision(name: str, batch: int, image: int) -> Workload:
    source = f"torchvision:{name}"
    models = _import("torchvision.models", source)
    if name not in models.list_models():
        raise ModelSourceError(f"unknown model {source!r}; torchvision has {', '.join(models.list_models())}")
    try:
        options = {"image_size": image} if name.startswith("vit_") else {}
        module = models.get_model(name, weights=None, **options)
    except Exception as exc:
        raise ModelSourceError(f"{source}: the model does not build: {type(exc).__name__}: {exc}") from exc
    module.train()
    x = torch.randn(batch, 3, image, image)
    labels = torch.randint(0, 1000, (batch,))
    params = sum(p.numel() for p in module.parameters())
    return Workload(module, (x,), _cross_entropy(labels), batch, f"{batch}x3x{image}x{image}",
                    f"torchvision {name}, {params / 1e6:.1f}M parameters, random init, {image}px images")


def _cross_entropy(labels):
    def loss(logits):
        if not isinstance(logits, torch.Tensor):  # e.g. Inception / GoogLeNet's auxiliary outputs
            logits = logits[0]
        return F.cross_entropy(logits, labels)
    return loss


class _Logits(nn.Module):
    """A transformers model called on token ids, returning its logits (the loss is computed outside)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def _huggingface(name: str, batch: int | None, seq: int | None, sizes: dict) -> Workload:
    source = f"hf:{name}"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs are built here: nothing to fetch
    transformers = _import("transformers", source)
    preset = _hf_presets()[name]
    batch, seq = batch or preset.default_batch, seq or preset.default_seq
    config = preset.config()
    names = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
             "kv_heads": "num_key_value_heads", "intermediate": "intermediate_size", "vocab": "vocab_size"}
    for key, value in sizes.items():
        attribute = names[key]
        if key == "intermediate" and name.startswith("gpt2"):
            attribute = "n_inner"
        if not hasattr(config, attribute) and attribute != "n_inner":
            raise ModelSourceError(f"{source}: its config has no {key} ({attribute})")
        setattr(config, attribute, value)
    if getattr(config, "head_dim", None) is not None and {"hidden", "heads"} & set(sizes):
        # Llama's config stores head_dim (hidden / heads) when it is made: follow the new sizes.
        config.head_dim = config.hidden_size // config.num_attention_heads
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if positions is not None and seq > positions:
        if name.startswith("gpt2"):
            config.n_positions = seq
        else:
            config.max_position_embeddings = seq
    config.attn_implementation = "sdpa"
    config._attn_implementation = "sdpa"
    if getattr(config, "num_experts", None):
        # Experts as one grouped matmul over the tokens sorted by expert (what transformers runs on a
        # GPU); its "eager" loop over the experts hit reads the routing (nonzero), which meta tensors cannot.
        config._experts_implementation = "grouped_mm"
    auto = transformers.AutoModelForCausalLM if preset.kind == "causal" else transformers.AutoModelForMaskedLM
    try:
        model = auto.from_config(config)
    except Exception as exc:
        raise ModelSourceError(f"{source}: the config does not build: {type(exc).__name__}: {exc}") from exc
    model.train()
    vocab = config.vocab_size
    ids = torch.randint(0, vocab, (batch, seq))
    targets = torch.randint(0, vocab, (batch, seq))

    if preset.kind == "causal":
        def loss(logits):  # next-token prediction
            return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    else:
        def loss(logits):  # masked LM, every position predicted
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    params = sum(p.numel() for p in model.parameters())
    layers = config.num_hidden_layers
    desc = (f"{preset.title}: {layers} layers, hidden {config.hidden_size}, {config.num_attention_heads} heads"
            + (f" ({config.num_key_value_heads} KV)" if getattr(config, "num_key_value_heads", None)
               not in (None, config.num_attention_heads) else "")
            + (f", {config.num_experts} experts of width {config.intermediate_size} ({config.num_experts_per_tok} "
               "active)" if getattr(config, "num_experts", None) else "")
            + f", vocab {vocab}, {params / 1e6:.0f}M parameters, random init, sequence {seq}")
    return Workload(_Logits(model), (ids,), loss, batch, f"{batch}x{seq} tokens", desc)


class _Denoiser(nn.Module):
    def __init__(self, unet: nn.Module):
        super().__init__()
        self.unet = unet

    def forward(self, latents, timesteps, text):
        return self.unet(latents, timesteps, encoder_hidden_states=text).sample


def _diffusers(name: str, batch: int | None) -> Workload:
    source = f"diffusers:{name}"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    diffusers = _import("diffusers", source)
    build_model = _sd_unet if name == "sd-unet" else _dit_xl_2
    try:
        return build_model(diffusers, batch)
    except Exception as exc:
        raise ModelSourceError(f"{source}: the config does not build: {type(exc).__name__}: {exc}") from exc


def _sd_unet(diffusers, batch: int | None) -> Workload:
    batch = batch or 8
    # Stable Diffusion 1.x's U-Net configuration (860M parameters).
    unet = diffusers.UNet2DConditionModel(
        sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768, attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                          "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"))
    unet.train()
    latents = torch.randn(batch, 4, 64, 64)
    timesteps = torch.randint(0, 1000, (batch,))
    text = torch.randn(batch, 77, 768)
    noise = torch.randn(batch, 4, 64, 64)
    params = sum(p.numel() for p in unet.parameters())
    return Workload(_Denoiser(unet), (latents, timesteps, text), lambda pred: F.mse_loss(pred, noise), batch,
                    f"{batch}x4x64x64 latents, {batch}x77x768 text",
                    f"Stable Diffusion 1.x U-Net, {params / 1e6:.0f}M parameters, random init, 512px images")


class ClassConditionalDenoiser(nn.Module):
    def __init__(self, transformer: nn.Module):
        super().__init__()
        self.transformer = transformer

    def forward(self, latents, timesteps, labels):
        return self.transformer(latents, timestep=timesteps, class_labels=labels).sample


def _dit_xl_2(diffusers, batch: int | None) -> Workload:
    batch = batch or 32
    # DiT-XL/2 (Peebles and Xie 2023) at 256px: 28 blocks, width 1152 (16 heads of 72), patch 2 on
    # 32x32x4 latents (256 tokens), adaLN-Zero conditioning on timestep and one of 1000 classes;
    # 8 output channels (noise and the learned variance). diffusers gives every block its own
    # timestep and class embedding (77.8M parameters in all, against the paper's one shared copy).
    transformer = diffusers.DiTTransformer2DModel(
        num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8, num_layers=28,
        sample_size=32, patch_size=2, num_embeds_ada_norm=1000, norm_type="ada_norm_zero")
    transformer.train()
    latents = torch.randn(batch, 4, 32, 32)
    timesteps = torch.randint(0, 1000, (batch,))
    labels = torch.randint(0, 1000, (batch,))
    noise = torch.randn(batch, 4, 32, 32)
    params = sum(p.numel() for p in transformer.parameters())
    return Workload(ClassConditionalDenoiser(transformer), (latents, timesteps, labels),
                    lambda pred: F.mse_loss(pred[:, :4], noise), batch, f"{batch}x4x32x32 latents, {batch} classes",
                    f"DiT-XL/2: 28 blocks, hidden 1152, 16 heads, patch 2, {params / 1e6:.0f}M parameters (the "
                    "paper's 675M with diffusers' copy of the timestep and class embedding in every block), random "
                    "init, 256px images (32x32x4 latents, 256 tokens), loss on the noise prediction only")


def _user_function(source: str) -> Callable | None:
    """``package.module:function``'s function (None for the zoo's and the libraries' sources), imported before
    :func:`build` and :func:`fake_workload` enter their device and fake-tensor contexts: a tensor the module makes
    at import (a global constant) made inside them would be meta or fake, and stay so in ``sys.modules``, breaking
    the caller's own steps with the model afterwards."""
    module_name, _, function_name = source.partition(":")
    if not function_name or module_name in SCHEMES:
        return None
    try:
        return getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as exc:
        raise ModelSourceError(f"unknown model {source!r}: {type(exc).__name__}: {exc}; sources: "
                               f"{describe_sources()}") from None


def _user_workload(source: str, function: Callable, batch: int | None, seq: int | None) -> Workload:
    accepted = inspect.signature(function).parameters
    kwargs = {key: value for key, value in (("batch", batch), ("seq", seq)) if value is not None}
    ignored = [key for key in kwargs if key not in accepted]
    if ignored:
        raise ModelSourceError(f"{source}: the function takes no {', '.join(ignored)} argument")
    on_build_device = _CudaOnBuildDevice()
    try:
        with on_build_device:
            built = function(**kwargs)
        model, inputs, loss_fn = built
    except Exception as exc:
        raise ModelSourceError(f"{source}: the function did not return (model, inputs, loss_fn): "
                               f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ModelSourceError(f"{source}: returned {type(model).__name__}, not a torch.nn.Module")
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    first = next((t for t in inputs if isinstance(t, torch.Tensor)), None)
    batch_size = batch or (first.shape[0] if first is not None and first.dim() else 1)
    shape = "x".join(map(str, first.shape)) if first is not None else ""
    return Workload(model, inputs, loss_fn, batch_size, shape, f"{source}", built_for_cuda=on_build_device.asked)


def _is_cuda(device) -> bool:
    return (isinstance(device, torch.device) and device.type == "cuda") or \
        (isinstance(device, str) and device.split(":")[0] == "cuda")


class _CudaOnBuildDevice(torch.overrides.TorchFunctionMode):
    """A user's function that puts its model or tensors on CUDA (``model.cuda()``, ``.to("cuda")``,
    ``device="cuda"``, ``with torch.device("cuda")``) gets them on the device the build is for (meta, CPU or fake
    CPU), and :attr:`asked` says so: such a step is its GPU's, traced on the CPU and re-traced for that GPU
    (dtrlab.trace.torch_compile.cuda_joint), as for ``--device``, whether or not this machine has one."""

    def __init__(self):
        super().__init__()
        self.asked = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            self.asked = True
            return args[0].to(torch.get_default_device())
        if func is torch.Tensor.to and any(_is_cuda(a) for a in args[1:]):
            self.asked = True
            args = tuple(torch.get_default_device() if _is_cuda(a) else a for a in args)
        if _is_cuda(kwargs.get("device")):
            self.asked = True
            kwargs["device"] = torch.get_default_device()
        return func(*args, **kwargs)
