"""``dtrlab capture MODEL --out FILE``: record a model's training step (needs torch; models need the models extra)."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    # The recorder owns its arguments (and imports torch only when run), so everything
    # after "capture" is handed to it unparsed, --help included.
    parser = subparsers.add_parser("capture", add_help=False, help="record a PyTorch model's training step as a simrd "
                                   "log, on the meta device (no memory): zoo, torchvision:, hf:, diffusers: or your "
                                   "own module:function (pip install 'dtrlab[torch,models]'; `dtrlab capture --help`)")
    parser.add_argument("arguments", nargs=argparse.REMAINDER)
    parser.set_defaults(handler=run)


def run(args) -> int:
    try:
        from ..trace.capture import capture_main
    except ImportError as exc:
        raise ValueError(f"dtrlab capture needs PyTorch ({exc}); install it with `pip install 'dtrlab[torch]'`") \
            from None
    return capture_main(args.arguments)
