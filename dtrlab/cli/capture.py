"""``dtrlab capture MODEL --out FILE``: record a model's training step (needs torch; models need the models extra)."""

from __future__ import annotations

import json
import sys

from ..trace.costs import COST_MODELS
from ..trace.sizes import SIZE_KEYS
from ..trace.sources import describe_sources
from .common import model_source, output_file, positive_int

#: Above this fraction of the peak pinned, capture warns: DTR has little to evict. (On the
#: zoo's traces DTR's threshold lies above it: hf:gpt2 --batch 2 --seq 128 pins 0.76 and
#: fails below 1.0; unet --batch 2 pins 0.51 and fails below 0.7.)
PINNED_WARNING = 0.5
#: The cost models that compute costs rather than time operators (flops, roofline:GPU): deterministic, and needing
#: no real tensors; what check and execute take.
MODELLED_COSTS = tuple(cost for cost in COST_MODELS if cost != "time")


def add_model_size_arguments(parser) -> None:
    """The options that size a model source, shared by capture and execute: --batch, --seq,
    --image and the hf: configuration overrides (dtrlab.trace.sizes.SIZE_KEYS)."""
    parser.add_argument("--batch", type=positive_int, default=None, help="batch size (default: the model's)")
    parser.add_argument("--seq", type=positive_int, default=None, help="sequence length (hf: models, user functions)")
    parser.add_argument("--image", type=positive_int, default=224, help="image side in pixels (torchvision:)")
    for key in SIZE_KEYS:
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key, type=positive_int, default=None,
                            help=f"override the hf: config's {key.replace('_', ' ')}")


def add_precision_arguments(parser) -> None:
    """--dtype (cast the model) and --autocast (float32 weights, forward and loss under torch.autocast)."""
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="cast parameters, buffers and floating inputs (default: the model's, float32)")
    parser.add_argument("--autocast", choices=("bfloat16", "float16"), default=None,
                        help="keep float32 master weights and run the forward and the loss under "
                             "torch.autocast with this dtype (mixed-precision training)")


def precision_options(options) -> dict:
    """The build options --dtype and --autocast give (torch dtypes, or None; a command without the option, such as
    check without --autocast, gives None)."""
    import torch

    return {key: getattr(torch, getattr(options, key)) if getattr(options, key, None) else None
            for key in ("dtype", "autocast")}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "capture", help="record a PyTorch model's training step as a simrd log, on the meta device (no memory): zoo, "
        "torchvision:, hf:, diffusers: or your own module:function (pip install 'dtrlab[torch,models]')",
        description="Record one training step of a model as a simrd log. Models are built from configurations "
        "(random initialisation, nothing downloaded) on the meta device: no tensor data, so memory does not grow "
        "with the model.")
    parser.add_argument("model", metavar="MODEL", type=model_source, help=f"model source: {describe_sources()}")
    parser.add_argument("--out", required=True, type=output_file, metavar="FILE",
                        help="output log; gzip-compressed if it ends in .gz")
    add_model_size_arguments(parser)
    add_precision_arguments(parser)
    parser.add_argument("--cost", choices=COST_MODELS, default="flops",
                        help="flops: FLOP counts; roofline:GPU: roofline time in ns on that GPU "
                             "(dtrlab.trace.costs); time: median wall time in ns (needs --real)")
    parser.add_argument("--real", action="store_true", help="real CPU tensors instead of the meta device")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timing repeats per operator (cost=time)")
    parser.add_argument("--seed", type=int, default=0, help="seed of parameters and data (default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)


def run(options) -> int:
    try:
        import torch  # noqa: F401 (installed?)
    except ImportError as exc:
        raise ValueError(f"dtrlab capture needs PyTorch ({exc}); install it with `pip install 'dtrlab[torch]'`") \
            from None
    from ..trace.capture import capture, package_versions  # imports torch._dynamo: after --help and usage errors

    sizes = {key: getattr(options, key) for key in SIZE_KEYS}
    recording = capture(options.model, real=options.real, cost=options.cost, repeats=options.repeats,
                        batch=options.batch, seq=options.seq, image=options.image, seed=options.seed,
                        progress=not options.quiet, **precision_options(options), **sizes)
    recording.write(options.out)
    fraction = recording.pinned_fraction
    summary = {"model": options.model, "batch": recording.meta["batch"], "out": options.out,
               "peak_live_bytes": recording.peak_live_bytes, "pinned_bytes": recording.pinned_bytes,
               "pinned_fraction": round(fraction, 4), "versions": package_versions(), **recording.meta}
    print(json.dumps(summary))
    if fraction > PINNED_WARNING:
        print(f"dtrlab capture: warning: {fraction:.0%} of the peak ({recording.pinned_bytes:,} of "
              f"{recording.peak_live_bytes:,} bytes) is pinned (parameters, inputs and other constants, and the "
              f"step's outputs): no budget below {fraction:.2f} of the peak can pass, and DTR has little to evict "
              "above it; a larger --batch, --seq or --image gives it activations to evict", file=sys.stderr)
    return 0
