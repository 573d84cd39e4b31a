"""`agent check <op> FILES_OR_DIRS...`: judge candidate kernels in the sandbox.

stdout ends with one JSON verdict per candidate (with --json, nothing else goes to stdout), so the
last line of a single-candidate run is its verdict (DESIGN.md's contract). Exit 0 whenever verdicts
were reached, whatever they say; 2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

from kernelloop.agent.commands.common_args import (
    add_cluster_arguments,
    add_device_argument,
    add_history_argument,
    add_min_gain_argument,
    add_registry_argument,
    add_timeout_argument,
    check_timeout_argument,
    open_pool,
)
from kernelloop.agent.render import print_table, throttled
from kernelloop.common.errors import KernelloopError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="judge candidate kernels: correct, safe and faster? (one JSON verdict each)")
    p.add_argument("op", help="the op the candidates implement, e.g. rmsnorm")
    p.add_argument("paths", nargs="+", metavar="FILE_OR_DIR", help="candidate .py files, or folders of them")
    add_device_argument(p, "where the candidates are judged")
    p.add_argument("--json", action="store_true", help="print only the JSON verdicts, one per line")
    add_registry_argument(p, "registry whose current kernel is the baseline")
    p.add_argument("--no-timing", action="store_true", help="correctness only (never accepted)")
    add_min_gain_argument(p)
    p.add_argument("--dtypes", default=None, help="comma-separated subset to check, e.g. float32,bfloat16")
    p.add_argument("--shapes", default=None, help='extra shapes as JSON, e.g. \'[{"tokens": 3, "hidden": 96}]\'')
    add_timeout_argument(p, "one candidate")
    p.add_argument("--memory-mb", type=int, default=4096, help="memory per candidate (default 4096)")
    p.add_argument("--seed", type=int, default=None, help="master seed for inputs (default: secret)")
    add_history_argument(p, "history database the attempts are recorded in")
    p.add_argument("--no-history", action="store_true", help="do not record the attempts")
    p.add_argument("--fresh-interpreter", action="store_true", help="no fork server: a new interpreter per candidate")
    p.add_argument("--unconfined", action="store_true",
                   help="judge without OS confinement where it cannot be set up (recorded in every verdict)")
    p.add_argument("--compile-for", default=None, metavar="TARGETS",
                   help="also compile each correct candidate for these GPU targets on CPU, e.g. sm90,sm80; refuse "
                        "it (failure compile-target) if a kernel does not compile, spills or exceeds shared memory")
    add_cluster_arguments(p)
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
    from kernelloop.agent.progress_view import ProgressView
    from kernelloop.history import History
    from kernelloop.kernels import get_op
    from kernelloop.kernels.device import resolve_device
    from kernelloop.kernels.spec import parse_dtype
    from kernelloop.kernels.target_compile import parse_targets
    from kernelloop.sandbox import CheckOptions

    check_timeout_argument(args)
    spec = get_op(args.op)
    device = resolve_device(args.device)
    try:
        compile_for = parse_targets(args.compile_for) if args.compile_for is not None else ()
    except KernelloopError as exc:
        raise KernelloopError(f"--compile-for: {exc}") from None
    files = candidate_files(args.paths)
    dtypes = tuple(args.dtypes.split(",")) if args.dtypes else ()
    for name in dtypes:
        parse_dtype(name)  # a usage error (one line, exit 2), never a verdict
    shapes = _shapes(args.shapes)
    for shape in shapes:
        if set(shape) != set(spec.test_shapes[0]):
            raise KernelloopError(f"--shapes: {spec.name} shapes have keys {sorted(spec.test_shapes[0])}, got {sorted(shape)}")
    options = CheckOptions(
        device=device, registry=args.registry, dtypes=dtypes,
        shapes=shapes, timing=not args.no_timing, min_gain=args.min_gain, timeout_s=args.timeout,
        memory_mb=args.memory_mb, seed=args.seed, fork_server=not args.fresh_interpreter,
        unconfined=args.unconfined, compile_for=compile_for)
    history = None if args.no_history else History(args.history)
    try:
        with ProgressView() as view:  # bars on a terminal (stderr), plain lines otherwise
            if args.cluster or args.cluster_workers:  # open_pool: --cluster-workers alone is a usage error
                verdicts = _judge_on_cluster(args, spec.name, files, options, history, view)
            else:
                verdicts = _judge_here(args, spec.name, files, options, history, view)
    finally:
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


def _outcome(path: Path, v: Any) -> str:
    return (f"{path}: {'ACCEPTED' if v.accepted else 'correct' if v.correct else 'REJECTED'}"
            f" ({v.duration_s:.1f} s) {v.reason}")


def _record(history: Any, op: str, source: str, path: Path, v: Any) -> None:
    from kernelloop.kernels.display import storable_text

    if history is not None:
        history.record_attempt(op, storable_text(source), "human", v.to_json(), label=path.name)


def _judge_here(args: argparse.Namespace, op: str, files: list[Path], options: Any, history: Any,
                view: Callable[[str], None]) -> list[Any]:
    """One candidate after another in this process's sandbox; a JSON line as each verdict comes."""
    from kernelloop.kernels.candidate.source_text import read_source
    from kernelloop.sandbox import Sandbox
    from kernelloop.sandbox.verdict import judge_or_refuse

    verdicts = []
    with Sandbox(options, progress=throttled(view, prefix="    ")) as sandbox:
        for i, path in enumerate(files, 1):
            view(f"[{i}/{len(files)}] {path} ...")
            source = read_source(path)  # bytes that are not UTF-8 stay visible to the static check, which refuses them
            v = judge_or_refuse(sandbox, op, source, str(path))  # a verdict whatever the text
            _record(history, op, source, path, v)
            view(f"[{i}/{len(files)}] {_outcome(path, v)}")
            verdicts.append(v)
            if args.json:
                print(v.json_line(), flush=True)
    return verdicts


def _judge_on_cluster(args: argparse.Namespace, op: str, files: list[Path], options: Any, history: Any,
                      view: Callable[[str], None]) -> list[Any]:
    """--cluster: every candidate at once across the pool's judges, each recorded as its verdict arrives;
    the JSON lines in file order once all are in."""
    from kernelloop.kernels.candidate.source_text import read_source
    from kernelloop.sandbox.cluster import ClusterJob

    sources = [read_source(path) for path in files]
    jobs = [ClusterJob(op=op, source=source, label=str(path), options=options) for path, source in zip(files, sources)]
    done: list[int] = []
    with open_pool(args, options.device, progress=view) as pool:
        view(f"judging {len(jobs)} candidates on {pool.size} judges")

        def arrived(i: int, v: Any) -> None:
            done.append(i)
            _record(history, op, sources[i], files[i], v)
            view(f"[{len(done)}/{len(jobs)}] {_outcome(files[i], v)}")  # the pool says how many are in flight

        verdicts = pool.judge(jobs, on_verdict=arrived)
    if args.json:
        for v in verdicts:
            print(v.json_line(), flush=True)
    return verdicts
