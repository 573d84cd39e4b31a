"""kernelloop's one import namespace.

The code lives in the repository's top-level folders (agent/, kernels/, engine/, profiler/, sandbox/,
history/); pyproject.toml installs each under this package (`kernelloop.kernels`, ...), so no generic
top-level name (`kernels` is also Hugging Face's kernel hub) reaches site-packages. The plumbing they all
share, `kernelloop.common`, lives in this folder (common/).

Run from a source tree that is not installed (a GPU machine handed the working tree), this package
also looks in the repository root, where those folders are.
"""

from pathlib import Path

# The folder holding this package: what a child process puts on PYTHONPATH to import kernelloop.
IMPORT_ROOT = Path(__file__).resolve().parent.parent
_SOURCE_ROOT = IMPORT_ROOT
if (_SOURCE_ROOT / "pyproject.toml").is_file() and (_SOURCE_ROOT / "kernels" / "spec.py").is_file():
    __path__.append(str(_SOURCE_ROOT))  # noqa: F821  (a package's __path__)
