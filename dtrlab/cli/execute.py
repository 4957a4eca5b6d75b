"""``dtrlab execute MODEL --ratio 0.5 --policy dtr``: one real training step under a budget (needs torch)."""

from __future__ import annotations

import json
import sys

from ..trace.sizes import SIZE_KEYS
from .capture import MODELLED_COSTS, add_model_size_arguments
from .common import add_policy_arguments, byte_count, model_source, policy_params, positive_float, semantics_argument


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "execute", help="run one real training step of a model under a budget, evicting and recomputing real "
        "tensors as the simulator decides (the model sources of capture; pip install 'dtrlab[torch,models]')",
        description="Capture MODEL's training step, then execute it for real under the budget: the simulator "
        "replays the captured trace in lockstep and its evictions and rematerializations happen on real tensors. "
        "Prints the simulator's record of the run plus wall times (docs/execute.md).")
    parser.add_argument("model", metavar="MODEL", type=model_source,
                        help="model source, as for dtrlab capture: a zoo model (resnet32, lstm, ...), torchvision:NAME, "
                             "hf:NAME, diffusers:NAME or module:function")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--ratio", type=positive_float,
                        help="budget as a fraction of the captured step's unbounded peak (int(peak*ratio))")
    budget.add_argument("--budget", type=byte_count, metavar="BYTES", help="budget in bytes")
    add_policy_arguments(parser)
    parser.add_argument("--cost", choices=MODELLED_COSTS, default="flops", metavar="COST",
                        help=f"cost model of the capture: {', '.join(MODELLED_COSTS)} (default flops)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (default) or cuda (the real caching allocator's peaks are reported beside the "
                             "simulator's accounting)")
    parser.add_argument("--real", action="store_true", help="capture with real CPU tensors, not on the meta device "
                        "(where the two traces differ, e.g. attention dropout; docs/execute.md)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default=None,
                        help="end the step with this optimizer's update (SGD momentum 0.9, lr 0.01; Adam lr 1e-3)")
    parser.add_argument("--cap-allocator", action="store_true",
                        help="on cuda: cap the caching allocator at the budget (set_per_process_memory_fraction)")
    add_model_size_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of parameters and data (default 0)")
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.add_argument("--evictions", action="store_true", help="also list the evicted storages in order")
    parser.set_defaults(handler=run)


def run(args) -> int:
    try:
        from ..execute import ExecutionError, run_step
        from ..policies import get_policy
    except ImportError as exc:
        raise ValueError(f"dtrlab execute needs PyTorch ({exc}); install it with `pip install 'dtrlab[torch]'`") \
            from None
    sizes = {key: getattr(args, key) for key in SIZE_KEYS if getattr(args, key) is not None}
    try:
        result = run_step(args.model, ratio=args.ratio, budget_bytes=args.budget,
                          policy=get_policy(args.policy, **policy_params(args.param)),
                          semantics=semantics_argument(args), cost=args.cost, device=args.device,
                          real=args.real, optimizer=args.optimizer, cap_allocator=args.cap_allocator,
                          batch=args.batch, seq=args.seq, image=args.image, seed=args.seed, **sizes)
    except ExecutionError as exc:
        print(f"dtrlab execute: error: {exc}", file=sys.stderr)
        return 2
    record = result.to_dict(evicted=args.evictions)
    if not result.passed:
        record["overhead"] = None  # no overhead of a failed run
    if args.json:
        print(json.dumps(record, default=str))
    else:
        width = max(map(len, record))
        for key, value in record.items():
            print(f"{key.ljust(width)}  {value}")
    return 0 if result.passed else 1

