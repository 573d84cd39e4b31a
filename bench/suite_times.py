"""Where the test suite's time goes, per test file, from pytest's JUnit XML (`pytest --junitxml=F`).

    python -m bench.suite_times quick.xml slow.xml [--names quick,slow] [--top 30]

Prints one markdown table: a row per test file with its seconds in each run (setup, call and teardown of
its tests, as pytest reports them), the total, and each run's wall time from the XML.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def per_file(path: Path) -> tuple[dict[str, float], float, int]:
    """({test file: seconds}, the run's wall seconds, tests) of one JUnit XML report."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    files: dict[str, float] = defaultdict(float)
    wall, tests = 0.0, 0
    for suite in suites:
        wall += float(suite.get("time", 0.0))
        for case in suite.iter("testcase"):
            module = case.get("classname", "").split(".")
            name = next((p for p in module if p.startswith("test_")), module[-1] if module else "?")
            files[f"{name}.py"] += float(case.get("time", 0.0))
            tests += 1
    return dict(files), wall, tests


def table(runs: list[tuple[str, Path]], top: int) -> str:
    measured = [(name, *per_file(path)) for name, path in runs]
    files = sorted({f for _, times, _, _ in measured for f in times},
                   key=lambda f: -sum(times.get(f, 0.0) for _, times, _, _ in measured))
    head = "| test file | " + " | ".join(f"{name} (s)" for name, *_ in measured) + " | total (s) |"
    lines = [head, "|---|" + "---|" * (len(measured) + 1)]
    for f in files[:top]:
        cells = [times.get(f, 0.0) for _, times, _, _ in measured]
        lines.append(f"| {f} | " + " | ".join(f"{c:.1f}" if c else "-" for c in cells) + f" | {sum(cells):.1f} |")
    rest = files[top:]
    if rest:
        cells = [sum(times.get(f, 0.0) for f in rest) for _, times, _, _ in measured]
        lines.append(f"| {len(rest)} other files | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {sum(cells):.1f} |")
    walls = [wall for _, _, wall, _ in measured]
    lines.append("| **wall time of the run** | " + " | ".join(f"**{w:.0f}**" for w in walls) + f" | **{sum(walls):.0f}** |")
    lines.append("| tests | " + " | ".join(str(n) for *_, n in measured) + f" | {sum(n for *_, n in measured)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.suite_times", description=__doc__.splitlines()[0])
    p.add_argument("xml", nargs="+", type=Path, help="JUnit XML reports, one per run")
    p.add_argument("--names", default=None, help="comma-separated column names (default: the files' stems)")
    p.add_argument("--top", type=int, default=30, help="rows before the rest is summed (default 30)")
    args = p.parse_args(argv)
    names = args.names.split(",") if args.names else [x.stem for x in args.xml]
    if len(names) != len(args.xml):
        print("--names: give one name per XML report", file=sys.stderr)
        return 2
    missing = [str(x) for x in args.xml if not x.is_file()]
    if missing:
        print(f"no such report: {', '.join(missing)}", file=sys.stderr)
        return 2
    print(table(list(zip(names, args.xml)), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
