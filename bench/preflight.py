"""Can every GPU step start on this machine? `python -m bench.preflight` (run by bench/gpu_check.sh).

A device machine cannot install anything from the network and is lent for minutes: a step that dies
on an import wastes the one try. This imports every module the GPU steps run and the third-party
packages they use, prints their versions, and exits 1 naming what is missing. On CPU it is the first
part of `bench/gpu_check.sh --rehearse`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys

# The project's modules each GPU step imports (bench.compile_targets is left out: importing it
# switches Triton to compiled mode for the whole process).
STEP_MODULES = ("bench.baselines", "bench.engine_gpu", "bench.sandbox_gpu", "bench.profile_gpu", "bench.tune_gpu",
                "bench.cluster_throughput", "bench.quantize_decode",
                "kernelloop.sandbox.inside.worker", "kernelloop.kernels.target_compile", "kernelloop.profiler.ncu", "kernelloop.agent.loop.graph")
# Distribution name -> module name, for what those steps need from outside the project.
PACKAGES = {"torch": "torch", "triton": "triton", "numpy": "numpy", "transformers": "transformers",
            "tokenizers": "tokenizers", "safetensors": "safetensors", "langgraph": "langgraph",
            "langgraph-checkpoint-sqlite": "langgraph.checkpoint.sqlite", "httpx": "httpx", "fastapi": "fastapi",
            "uvicorn": "uvicorn", "nsight-python": "nsight", "pytest": "pytest"}


def main() -> int:
    missing = []
    for dist, module in PACKAGES.items():
        try:
            importlib.import_module(module)
            version = importlib.metadata.version(dist)
            print(f"  {dist:30s} {version}")
        except Exception as exc:  # noqa: BLE001  (any failure to import is what this reports)
            missing.append(f"{dist} ({type(exc).__name__}: {str(exc)[:120]})")
    for module in STEP_MODULES:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001
            missing.append(f"{module} ({type(exc).__name__}: {str(exc)[:120]})")
    import torch

    print(f"  cuda available: {torch.cuda.is_available()}, torch cuda build: {torch.version.cuda}")
    for line in missing:
        print(f"preflight: cannot import {line}", file=sys.stderr)
    print("preflight: " + ("ok" if not missing else f"{len(missing)} missing"))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
