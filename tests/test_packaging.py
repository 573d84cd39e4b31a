"""Issue #15: kernelloop installs one import package, `kernelloop`, and its layers import each other
only the way docs/ARCHITECTURE.md says.

The folders stay at the repository's top level (agent/, kernels/, ...); pyproject.toml maps each
under `kernelloop`. A bare `import kernels` would find Hugging Face's kernel hub once installed, so
no file may use the bare names.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("agent", "kernels", "engine", "profiler", "sandbox", "history")
# kernelloop.common: the plumbing every layer imports; it lives inside the kernelloop/ folder itself.
COMMON = "common"
PYTHON_FOLDERS = (*LAYERS, "kernelloop", "bench", "tests")


def _folder(layer: str) -> Path:
    return REPO / "kernelloop" / COMMON if layer == COMMON else REPO / layer


def _python_files(folders=PYTHON_FOLDERS):
    for folder in folders:
        yield from (REPO / folder).rglob("*.py")


def _imported_modules(tree: ast.AST):
    """(line, dotted name) of every absolute import, at any depth (lazy imports in functions too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
            if node.module == "kernelloop":  # `from kernelloop import kernels`
                yield from ((node.lineno, f"kernelloop.{alias.name}") for alias in node.names)


def test_pyproject_installs_every_folder_under_kernelloop():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(config["packages"])
    on_disk = {"kernelloop"} | {
        "kernelloop." + ".".join(init.parent.relative_to(REPO).parts)
        for layer in LAYERS for init in (REPO / layer).rglob("__init__.py")} | {
        "kernelloop." + ".".join(init.parent.relative_to(REPO / "kernelloop").parts)
        for init in (REPO / "kernelloop").rglob("*/__init__.py")}
    assert f"kernelloop.{COMMON}" in on_disk
    assert packages == on_disk, f"add to pyproject.toml: {sorted(on_disk - packages)}; remove: {sorted(packages - on_disk)}"
    assert config["package-dir"] == {"kernelloop": "kernelloop", **{f"kernelloop.{x}": x for x in LAYERS}}
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert all(target.startswith("kernelloop.") for target in scripts.values())


def test_no_file_imports_a_bare_top_level_name():
    offenders = []
    for path in _python_files():
        for line, name in _imported_modules(ast.parse(path.read_text())):
            if name.split(".")[0] in LAYERS:
                offenders.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert not offenders, "import through kernelloop.*:\n" + "\n".join(offenders)


def test_nothing_inside_the_sandbox_imports_the_judges_side():
    """sandbox/inside/ runs confined, next to a candidate's code: it may import the shared modules
    (messages, wire, options, verdict, lifetime) and the layers below, never sandbox/judge/ or the cluster."""
    offenders = []
    for path in (REPO / "sandbox" / "inside").rglob("*.py"):
        for line, name in _imported_modules(ast.parse(path.read_text())):
            if name.startswith(("kernelloop.sandbox.judge", "kernelloop.sandbox.cluster", "kernelloop.agent")) or \
                    name == "kernelloop.sandbox" and "import judge" in path.read_text().splitlines()[line - 1]:
                offenders.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert not offenders, "the confined side imports the judge's:\n" + "\n".join(offenders)
    shared = {p.stem for p in (REPO / "sandbox").glob("*.py")} - {"__init__"}
    assert shared == {"lifetime", "messages", "options", "verdict", "wire"}, "a new module belongs in judge/ or inside/"


def _rule_in_architecture() -> dict[str, set[str]]:
    """The `layer -> {a, b}` / `layer -> a` pairs of ARCHITECTURE.md's dependency paragraph, plus `common`
    for every layer when the paragraph says every layer imports it (and common itself imports none)."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    paragraph = text.split("Dependencies point one way:", 1)[1].split("\n\n", 1)[0]
    rule: dict[str, set[str]] = {layer: set() for layer in (*LAYERS, COMMON)}
    for source, targets in re.findall(r"`(\w+) -> (\{[^}]*\}|\w+)", paragraph):
        rule[source] |= {t.strip() for t in targets.strip("{}").split(",")}
    if "which every layer imports and which imports none of them" in " ".join(paragraph.split()):
        for layer in LAYERS:
            rule[layer].add(COMMON)
    return rule


def _imports_between_layers() -> dict[str, dict[str, str]]:
    """layer -> {imported layer: one file:line that does it}; `common` (kernelloop/common/) counts as a layer."""
    found: dict[str, dict[str, str]] = defaultdict(dict)
    for layer in (*LAYERS, COMMON):
        for path in _folder(layer).rglob("*.py"):
            for line, name in _imported_modules(ast.parse(path.read_text())):
                parts = name.split(".")
                if (parts[0] == "kernelloop" and len(parts) > 1 and parts[1] in (*LAYERS, COMMON)
                        and parts[1] != layer):
                    found[layer].setdefault(parts[1], f"{path.relative_to(REPO)}:{line}")
    return found


def test_architecture_dependency_rule_is_what_the_code_imports():
    rule, actual = _rule_in_architecture(), _imports_between_layers()
    assert rule["agent"], "ARCHITECTURE.md's dependency paragraph was not found"
    assert not rule[COMMON], "common imports none of the layers"
    for layer in (*LAYERS, COMMON):
        unlisted = {target: where for target, where in actual[layer].items() if target not in rule[layer]}
        assert not unlisted, f"{layer} imports layers the rule does not allow: {unlisted}"
        unused = rule[layer] - set(actual[layer])
        assert not unused, f"the rule lets {layer} import {sorted(unused)}, which it does not: tighten the rule"
    assert not any("agent" in targets for targets in actual.values()), "nothing imports agent"


def test_the_checker_sees_a_forbidden_import(tmp_path, monkeypatch):
    # The rule test must be able to fail: a kernels module that imports the engine is reported.
    fake = tmp_path / "repo"
    for layer in LAYERS:
        (fake / layer).mkdir(parents=True)
    (fake / "kernels" / "bad.py").write_text("def f():\n    from kernelloop.engine.engine import Engine\n")
    # And common, which every layer imports, imports none of them: not even the op library.
    (fake / "kernelloop" / COMMON).mkdir(parents=True)
    (fake / "kernelloop" / COMMON / "bad.py").write_text("from kernelloop.common import errors\n"
                                                         "from kernelloop import kernels\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", fake)
    found = _imports_between_layers()
    assert found["kernels"] == {"engine": "kernels/bad.py:2"}
    assert found[COMMON] == {"kernels": "kernelloop/common/bad.py:2"}


def test_the_wheel_holds_only_the_kernelloop_package(tmp_path):
    source = tmp_path / "source"  # a copy: building writes build/ and egg-info into the source folder
    for part in (*LAYERS, "kernelloop"):
        shutil.copytree(REPO / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / part, source / part)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path), "-q"], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = tmp_path.glob("kernelloop-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    top = {name.split("/")[0] for name in names}
    assert top == {"kernelloop", next(t for t in top if t.endswith(".dist-info"))}, top
    assert "kernelloop/kernels/ops/rmsnorm.py" in names and "kernelloop/agent/cli.py" in names
    assert "kernelloop/common/errors.py" in names
    assert "agent = kernelloop.agent.cli:main" in entry_points


def test_kernelloop_runs_next_to_hugging_faces_kernels_package(tmp_path):
    pytest.importorskip("kernels", reason="the dev extra installs Hugging Face's `kernels` package")
    # From a folder outside the repository, so `kernels` can only mean the installed package.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "import kernels, kernelloop.kernels.ops as ops, torch\n"
        "assert hasattr(kernels, 'get_kernel'), kernels.__file__\n"
        "spec = ops.get_op('rmsnorm')\n"
        "args = spec.make_inputs(spec.test_shapes[0], torch.float32, 0, 'cpu')\n"
        "tol = spec.tolerance(torch.float32, spec.test_shapes[0])\n"
        "torch.testing.assert_close(spec.forward(*args), spec.reference(*args), atol=tol.atol, rtol=tol.rtol)\n"
        "print(kernels.__file__); print(ops.__file__)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    hub, ours = result.stdout.split()
    assert "site-packages" in hub and Path(hub).resolve() != REPO / "kernels" / "__init__.py"
    assert Path(ours).resolve() == REPO / "kernels" / "ops" / "__init__.py"
    agent = Path(sys.executable).with_name("agent")
    listed = subprocess.run([str(agent), "ops"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0 and "rmsnorm" in listed.stdout, listed.stderr[-2000:]


def test_inside_the_checkout_kernels_still_means_hugging_faces_package():
    pytest.importorskip("kernels", reason="the dev extra installs Hugging Face's `kernels` package")
    # pytest and `python -m` put the checkout's root first on sys.path, where kernels/ is ours; transformers
    # imports the hub's names from `kernels` whenever the hub is installed (a version in its range).
    code = ("import sys; sys.path.insert(0, '')\n"
            "import kernels\n"
            "from kernels import get_kernel\n"
            "import kernelloop.kernels.ops as ops\n"
            "print(kernels.__file__); print(ops.__file__)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    hub, ours = result.stdout.split()
    assert Path(hub).resolve() != REPO / "kernels" / "__init__.py" and "site-packages" in hub
    assert Path(ours).resolve() == REPO / "kernels" / "ops" / "__init__.py"


def test_an_uninstalled_source_tree_imports_from_its_folders():
    # A GPU machine is handed the working tree, not an installed package: `python -m bench.x` from the
    # repository root must still find kernelloop.<layer> in the top-level folders.
    code = ("import sys\n"
            "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
            "import kernelloop.sandbox.judge.plan, kernelloop.agent.cli\n"
            "print(kernelloop.sandbox.judge.plan.__file__)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert Path(result.stdout.strip()) == REPO / "sandbox" / "judge" / "plan.py"
