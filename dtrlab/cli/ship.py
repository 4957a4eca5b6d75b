"""``dtrlab ship TARGET``: regenerate the shipped results (results/shipped/) of the notebooks, the limit
census or the policy search."""

from __future__ import annotations

import argparse

from .common import Parser


def register(subparsers) -> None:
    # The targets' options are built when the command runs (--help included): they import pandas.
    parser = subparsers.add_parser("ship", add_help=False, help="regenerate results/shipped/: the notebooks' runs "
                                   "(results), the limit census (anatomy) or the policy search's results (search); "
                                   "`dtrlab ship TARGET --help`")
    parser.set_defaults(handler=run, passthrough=True)


def ship_parser() -> Parser:
    """The options of ``dtrlab ship`` and of each target (imports the pipeline)."""
    from ..pipeline.ship import TARGETS, __doc__ as description

    parser = Parser(prog="dtrlab ship", description=description.split("\n\n")[0])
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an unexpected error")
    targets = parser.add_subparsers(dest="target", required=True, metavar="TARGET")
    for name, module in TARGETS.items():
        summary = module.__doc__.split("\n\n")[0]
        target = targets.add_parser(name, help=summary, description=summary)
        module.add_arguments(target)
        target.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                            help="show the full traceback of an unexpected error")
        target.set_defaults(ship=module.run)
    parser.targets = targets.choices  # name -> its parser
    return parser


def run(args) -> int:
    parser = ship_parser()
    options, unknown = parser.parse_known_args(args.arguments)
    target = parser.targets[options.target]
    if unknown:
        target.unrecognized(unknown)
    args.debug = args.debug or options.debug
    return options.ship(options, target)
