"""`agent check <op> FILES_OR_DIRS...`: judge candidate kernels in the sandbox.

stdout ends with one JSON verdict per candidate (with --json, nothing else goes to stdout), so the
last line of a single-candidate run is its verdict (DESIGN.md's contract). Exit 0 whenever verdicts
were reached, whatever they say; 2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kernelloop.kernels import get_op
from kernelloop.kernels.device import resolve_device
from kernelloop.kernels.errors import KernelloopError
from kernelloop.kernels.target_compile import parse_targets
from kernelloop.history import History
from kernelloop.sandbox import CheckOptions, Sandbox

from kernelloop.agent.render import print_table, throttled


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="judge candidate kernels: correct, safe and faster? (one JSON verdict each)")
    p.add_argument("op", help="the op the candidates implement, e.g. rmsnorm")
    p.add_argument("paths", nargs="+", metavar="FILE_OR_DIR", help="candidate .py files, or folders of them")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    p.add_argument("--json", action="store_true", help="print only the JSON verdicts, one per line")
    p.add_argument("--registry", type=Path, default=None,
                   help="registry whose current kernel is the baseline (default: $KERNELLOOP_REGISTRY or ~/.local/share/kernelloop/registry)")
    p.add_argument("--no-timing", action="store_true", help="correctness only (never accepted)")
    p.add_argument("--min-gain", type=float, default=0.03, help="required lower bound of the speedup interval, minus 1 (default 0.03)")
    p.add_argument("--dtypes", default=None, help="comma-separated subset to check, e.g. float32,bfloat16")
    p.add_argument("--shapes", default=None, help='extra shapes as JSON, e.g. \'[{"tokens": 3, "hidden": 96}]\'')
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per candidate, shared by correctness and timing (default: 180 on cpu, 120 on cuda)")
    p.add_argument("--memory-mb", type=int, default=4096, help="memory per candidate (default 4096)")
    p.add_argument("--seed", type=int, default=None, help="master seed for inputs (default: secret)")
    p.add_argument("--history", type=Path, default=None, metavar="PATH",
                   help="history database (default: $KERNELLOOP_HISTORY or ~/.local/share/kernelloop/history.db)")
    p.add_argument("--no-history", action="store_true", help="do not record the attempts")
    p.add_argument("--fresh-interpreter", action="store_true", help="no fork server: a new interpreter per candidate")
    p.add_argument("--unconfined", action="store_true",
                   help="judge without OS confinement where it cannot be set up (recorded in every verdict)")
    p.add_argument("--compile-for", default=None, metavar="TARGETS",
                   help="also compile each correct candidate for these GPU targets on CPU, e.g. sm90,sm80; refuse "
                        "it (failure compile-target) if a kernel does not compile, spills or exceeds shared memory")
    p.set_defaults(run=run)


def candidate_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(p for p in path.glob("*.py") if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise KernelloopError(f"{raw}: no such file or directory")
    if not files:
        raise KernelloopError("no candidate .py files found in " + ", ".join(paths))
    return files


def _shapes(text: str | None) -> tuple[dict, ...]:
    if not text:
        return ()
    try:
        shapes = json.loads(text)
    except ValueError as exc:
        raise KernelloopError(f"--shapes is not JSON: {exc}") from None
    if not isinstance(shapes, list) or not all(isinstance(s, dict) and all(isinstance(v, int) for v in s.values())
                                               for s in shapes):
        raise KernelloopError('--shapes must be a JSON list of objects of integers, e.g. [{"tokens": 3, "hidden": 96}]')
    return tuple(shapes)


def run(args: argparse.Namespace) -> int:
    spec = get_op(args.op)
    device = resolve_device(args.device)
    try:
        compile_for = parse_targets(args.compile_for) if args.compile_for is not None else ()
    except KernelloopError as exc:
        raise KernelloopError(f"--compile-for: {exc}") from None
    files = candidate_files(args.paths)
    shapes = _shapes(args.shapes)
    for shape in shapes:
        if set(shape) != set(spec.test_shapes[0]):
            raise KernelloopError(f"--shapes: {spec.name} shapes have keys {sorted(spec.test_shapes[0])}, got {sorted(shape)}")
    options = CheckOptions(
        device=device, registry=args.registry, dtypes=tuple(args.dtypes.split(",")) if args.dtypes else (),
        shapes=shapes, timing=not args.no_timing, min_gain=args.min_gain, timeout_s=args.timeout,
        memory_mb=args.memory_mb, seed=args.seed, fork_server=not args.fresh_interpreter,
        unconfined=args.unconfined, compile_for=compile_for)
    verdicts = []
    history = None if args.no_history else History(args.history)
    progress = throttled(lambda message: print(message, file=sys.stderr, flush=True), prefix="    ")
    with Sandbox(options, progress=progress) as sandbox:
        for i, path in enumerate(files, 1):
            print(f"[{i}/{len(files)}] {path} ...", file=sys.stderr, flush=True)
            source = path.read_text(errors="replace")
            v = sandbox.judge_source(spec.name, source, str(path))
            if history is not None:
                history.record_attempt(spec.name, source, "human", v.to_json(), label=path.name)
            print(f"[{i}/{len(files)}] {path}: {'ACCEPTED' if v.accepted else 'correct' if v.correct else 'REJECTED'}"
                  f" ({v.duration_s:.1f} s) {v.reason}", file=sys.stderr, flush=True)
            verdicts.append(v)
            if args.json:
                print(v.json_line(), flush=True)
    if history is not None:
        history.close()
    if not args.json:
        rows = [(Path(v.file).name, "yes" if v.correct else "no", "yes" if v.accepted else "no",
                 f"{v.speedup:.3f}x" if v.speedup is not None else "-", v.failure or "-", v.reason) for v in verdicts]
        print_table(f"agent check {spec.name} on {verdicts[0].device}",
                    ("candidate", "correct", "accepted", "speedup", "failure", "reason"), rows)
        for v in verdicts:
            print(v.json_line())
    return 0
