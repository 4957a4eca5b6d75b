"""``dtrlab figures``: run every notebook with papermill, figures to figures/<trace set>/ (what `make figures` runs)."""

from __future__ import annotations

from .common import Parser


def register(subparsers) -> None:
    # The options are built when the command runs (--help included): the pipeline imports matplotlib.
    parser = subparsers.add_parser("figures", add_help=False, help="run every notebook (papermill): figures to "
                                   "figures/<trace set>/, executed notebooks to results/notebooks/ (`dtrlab figures "
                                   "--help`)")
    parser.set_defaults(handler=run, passthrough=True)


def run(args) -> int:
    from ..pipeline import figures

    parser = Parser(prog="dtrlab figures", description=figures.__doc__.split("\n\n")[0])
    figures.add_arguments(parser)
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an unexpected error, and "
                        "every line the kernels print (also DTRLAB_DEBUG=1)")
    options = parser.parse_args(args.arguments)
    args.debug = args.debug or options.debug
    return figures.run(options, parser)
