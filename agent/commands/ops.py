"""`agent ops`: the op library; `--check` runs every baseline kernel against its reference."""

from __future__ import annotations

import argparse
import sys
import time

from kernelloop.agent.commands.common_args import add_device_argument
from kernelloop.agent.render import print_json, print_table
from kernelloop.common.errors import KernelloopError

# The op table (torch, Triton) is loaded when the command runs: `agent --help` stays fast.

ENGINE_SHAPES = 12  # on a GPU, this many engine shapes per op, spread over models, decode and prefill


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ops", help="list the ops (signatures, dtypes, shapes); --check verifies the baselines")
    p.add_argument("names", nargs="*", metavar="OP", help="only these ops (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--check", action="store_true", help="check each baseline Triton kernel against its torch reference")
    add_device_argument(p, "where --check runs the kernels")
    p.add_argument("--seeds", type=int, default=2, help="random seeds per shape and dtype (default 2)")
    p.add_argument("--dtypes", default=None, help="comma-separated subset, e.g. float32,bfloat16")
    p.add_argument("--template", default=None, metavar="OP",
                   help="print OP's baseline kernel as a self-contained candidate module (a starting point for "
                        "`agent check OP FILE`) and exit")
    p.set_defaults(run=run)


def template(op: str) -> str:
    """The op's baseline kernel file (a self-contained candidate module, kernels/ops/<op>_kernel.py)."""
    from kernelloop.kernels.ops import baseline_source, get_op

    get_op(op)  # an unknown op: one line, exit 2
    return (f"# {op}: the baseline Triton kernel as a self-contained candidate.\n"
            f"# Edit it, then judge it: agent check {op} THIS_FILE\n" + baseline_source(op))


def run(args: argparse.Namespace) -> int:
    from kernelloop.kernels.ops import OPS, get_op
    from kernelloop.kernels.spec import dtype_name

    if args.template:
        sys.stdout.write(template(args.template))
        return 0
    specs = [get_op(n) for n in args.names] if args.names else list(OPS.values())
    if not args.check:
        if args.json:
            print_json({"ops": [s.describe() for s in specs]})
        else:
            rows = [(s.name, s.signature, ", ".join(dtype_name(d) for d in s.dtypes), len(s.engine_shapes),
                     ", ".join(sorted(s.engine_shapes[0]))) for s in specs]
            print_table("kernelloop ops", ("op", "signature", "dtypes", "engine shapes", "shape keys"), rows)
        return 0
    return check(specs, args)


def check(specs: list, args: argparse.Namespace) -> int:
    from kernelloop.kernels.compare import CheckResult, check_impl
    from kernelloop.kernels.device import device_fingerprint, resolve_device
    from kernelloop.kernels.spec import dtype_name, parse_dtype, pick_shapes

    device = resolve_device(args.device)
    if args.seeds < 1:
        raise KernelloopError("--seeds must be at least 1")
    dtypes = [parse_dtype(d.strip()) for d in args.dtypes.split(",")] if args.dtypes else None
    # On the interpreter (~1 ms per Triton program) only the small test shapes are affordable;
    # on a GPU, a spread of engine shapes too (inputs are generated on the host, so not all of them).
    def shapes_for(spec) -> tuple:
        return spec.test_shapes + (tuple(pick_shapes(spec.engine_shapes, ENGINE_SHAPES)) if not device.interpreted else ())

    summary, failures, results = [], [], []
    for spec in specs:
        shapes = shapes_for(spec)
        for dtype in dtypes or spec.dtypes:
            if dtype not in spec.dtypes:
                continue
            start = time.perf_counter()
            print(f"checking {spec.name} {dtype_name(dtype)} on {device} ...", file=sys.stderr, flush=True)
            batch: list[CheckResult] = [
                check_impl(spec, spec.forward, shape, dtype, seed, device) for shape in shapes for seed in range(args.seeds)
            ]
            results += batch
            failures += [r for r in batch if not r.ok]
            passed = sum(r.ok for r in batch)
            worst = max((r.max_abs_err for r in batch), default=0.0)
            fraction = max((r.tol_fraction for r in batch), default=0.0)
            summary.append((spec.name, dtype_name(dtype), len(shapes), f"{passed}/{len(batch)}", f"{worst:.3g}",
                            f"{fraction:.2f}", f"{time.perf_counter() - start:.2f}"))
    if args.json:
        print_json({"device": device_fingerprint(device), "ok": not failures,
                    "results": [r.__dict__ for r in results]})
    else:
        title = f"baseline kernels vs torch reference on {device_fingerprint(device)}"
        print_table(title, ("op", "dtype", "shapes", "passed", "max abs err", "worst err / tolerance", "seconds"), summary)
        for r in failures:
            print(str(r))
        print(f"{len(results) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0
