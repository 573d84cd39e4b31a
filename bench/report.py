"""One writer for every benchmark's results: a table plus the context needed to trust it.

`write_report` writes `<out_dir>/<YYYY-MM-DD>-<device-slug>-<name>.md` with the date, the device
(name, compute capability, driver; or `cpu-interpreter` and the CPU model), the git commit, the
exact command, torch and triton versions, the table and the notes. `print_table` prints the same
table to stdout as aligned plain text.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import triton

from kernelloop.kernels.device import CPU_INTERPRETER, device_fingerprint

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT_DIR = REPO_ROOT / "docs" / "benchmarks"

INTERPRETER_WARNING = (
    "These timings were taken with Triton's CPU interpreter (`cpu-interpreter`): they describe the "
    "interpreter, not a GPU, and say nothing about GPU performance."
)


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=REPO_ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str:
    """Short HEAD commit, marked when the working tree has uncommitted changes."""
    head = _run(["git", "rev-parse", "--short", "HEAD"])
    if head is None:
        inside = _run(["git", "rev-parse", "--is-inside-work-tree"]) == "true"
        return "uncommitted (no commits yet)" if inside else "unknown (not a git checkout)"
    dirty = _run(["git", "status", "--porcelain"])
    return f"{head} + uncommitted changes" if dirty else head


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=None)
def device_facts(device: str | torch.device) -> dict[str, str]:
    """What a reader needs to know about the device the numbers were measured on."""
    dev = torch.device(device)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        driver = _run(["nvidia-smi", f"--id={index}", "--query-gpu=driver_version", "--format=csv,noheader"])
        return {
            "device": device_fingerprint(dev),
            "name": props.name,
            "compute capability": f"{props.major}.{props.minor}",
            "memory": f"{props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs",
            "driver": driver or "unknown (nvidia-smi unavailable)",
            "cuda (torch build)": str(torch.version.cuda),
        }
    return {
        "device": CPU_INTERPRETER,
        "cpu": f"{_cpu_model()} ({os.cpu_count()} logical cores)",
    }


def format_value(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:
            return "nan"
        mag = abs(value)
        if mag >= 100:
            return f"{value:.0f}"
        if mag >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}" if mag >= 0.01 or mag == 0 else f"{value:.2g}"
    return str(value)


def _columns(rows: list[dict]) -> list[str]:
    cols: list[str] = []
    for row in rows:
        cols.extend(k for k in row if k not in cols)
    return cols


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "_(no rows)_"
    cols = _columns(rows)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in rows:
        cells = [format_value(row.get(c)).replace("|", "\\|").replace("\n", " ") for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def text_table(rows: list[dict]) -> str:
    """Aligned plain-text columns: text left-aligned, numbers right-aligned."""
    if not rows:
        return "(no rows)"
    cols = _columns(rows)
    cells = [[format_value(row.get(c)) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    numeric = [all(isinstance(row.get(c), (int, float)) or row.get(c) is None for row in rows) for c in cols]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(cols), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def print_table(rows: list[dict]) -> None:
    print(text_table(rows), flush=True)


def current_command() -> str:
    """This process's command line, as `python -m pkg.mod args` when run with -m."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        return " ".join(["python", "-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]])
    return " ".join(["python", *sys.argv])


def write_report(
    name: str,
    title: str,
    table_rows: list[dict],
    *,
    device: str | torch.device,
    command: str | None = None,
    notes: list[str] | str = (),
    out_dir: str | Path | None = None,
    interpreter_timings: bool = True,
    facts: dict[str, str] | None = None,
) -> Path:
    """Write the report and return its path; `command` defaults to this process's argv.

    `facts` replaces the device's own facts for reports about no device (e.g. compiled for a GPU
    target on CPU: {"device": "sm90-compile", ...}); its "device" names the file.

    `interpreter_timings=False` for CPU benchmarks that time no Triton kernel (host overhead,
    torch ops): they get no interpreter banner.
    """
    now = _dt.datetime.now().astimezone()
    out = Path(out_dir) if out_dir is not None else DEFAULT_OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    facts = facts or device_facts(device)
    slug = re.sub(r"[^a-z0-9]+", "-", facts["device"].lower()).strip("-")
    path = out / f"{now:%Y-%m-%d}-{slug}-{name}.md"
    if command is None:
        command = current_command()
    lines = [f"# {title}", "", f"- date: {now:%Y-%m-%d %H:%M %Z}"]
    lines += [f"- {key}: {value}" for key, value in facts.items()]
    lines += [
        f"- commit: {git_commit()}",
        f"- command: `{command}`",
        f"- torch {torch.__version__}, triton {triton.__version__}, python {platform.python_version()}",
        "",
    ]
    if facts["device"] == CPU_INTERPRETER and interpreter_timings:
        lines += [f"> {INTERPRETER_WARNING}", ""]
    lines += [markdown_table(table_rows), ""]
    notes_list = [notes] if isinstance(notes, str) else list(notes)
    if notes_list:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes_list] + [""]
    path.write_text("\n".join(lines))
    return path
