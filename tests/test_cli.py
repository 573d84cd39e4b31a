"""The `agent` command line: ops, registry verbs, and one-line errors with exit 2."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from kernelloop.agent.cli import main
from kernelloop.kernels import OPS

from tests.registry_support import commit_by_hand
from tests.test_registry import RMSNORM_SOURCE, add


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_ops_json_lists_the_ten_ops_with_signatures_and_dtypes(capsys):
    code, out, _ = run(capsys, "ops", "--json")
    assert code == 0
    ops = {o["name"]: o for o in json.loads(out)["ops"]}
    assert set(ops) == set(OPS) and len(ops) == 10  # seven, and linear's three quantized weights
    assert ops["linear_int4"]["args"] == ["x", "qweight", "scales", "bias"]
    assert ops["rope"]["signature"] == "rope(q, k, positions, cos_sin_cache) -> (q_out, k_out)"
    assert ops["decode_attention"]["args"] == ["q", "k_buffer", "v_buffer", "kv_indptr", "kv_indices", "sm_scale"]
    for op in ops.values():
        assert op["dtypes"] == ["float32", "float16", "bfloat16"]


def test_ops_table_and_check(capsys):
    code, out, _ = run(capsys, "ops")
    assert code == 0 and all(name in out for name in OPS)
    code, out, err = run(capsys, "ops", "rmsnorm", "silu_mul", "--check", "--seeds", "1", "--dtypes", "float32")
    assert code == 0, out + err
    assert "passed, 0 failed" in out


def test_ops_check_json(capsys):
    code, out, _ = run(capsys, "ops", "rmsnorm", "--check", "--seeds", "1", "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] and data["device"] == "cpu-interpreter"
    assert len(data["results"]) == len(OPS["rmsnorm"].test_shapes) * 3


@pytest.mark.parametrize("argv,message", [
    (("ops", "matmul"), "unknown op 'matmul'"),
    (("ops", "--check", "--seeds", "0"), "--seeds must be at least 1"),
    (("ops", "--check", "--device", "cuda"), "no CUDA device"),
    (("ops", "--check", "--dtypes", "float8"), "unknown dtype"),
    (("registry", "show", "rmsnorm-nope"), "no entry"),
    (("registry", "rollback", "deadbeef"), "neither an entry id nor a commit"),
    (("registry", "list", "--op", "matmul"), "unknown op"),
    (("tune", "rmsnorm", "--device", "cuda"), "--device cuda: no CUDA device is visible here"),
    (("tune", "rmsnorm", "--timeout", "0"), "--timeout must be positive"),
    (("daemon", "--timeout", "-1", "--metrics-port", "-1"), "--timeout must be positive"),
    (("verify", "--device", "cuda"), "no CUDA device"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.setenv("KERNELLOOP_REGISTRY", str(tmp_path / "reg"))
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_missing_registry_path_is_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "registry", "list", "--registry", str(tmp_path / "typo"))
    assert code == 2 and err == f"agent registry: no registry at {tmp_path / 'typo'}\n"


def test_unreadable_registry_is_one_line(capsys, registry):
    add(registry)
    registry.manifest_path.write_text("{")
    commit_by_hand(registry)
    code, _, err = run(capsys, "registry", "list", "--registry", str(registry.path))
    assert code == 2 and "corrupt" in err and err.count("\n") == 1


def test_registry_list_show_log_rollback(capsys, registry):
    entry = add(registry)
    reg = ("--registry", str(registry.path))
    code, out, _ = run(capsys, "registry", "list", *reg, "--json")
    assert code == 0 and [e["id"] for e in json.loads(out)["entries"]] == [entry.id]
    code, out, _ = run(capsys, "registry", "show", entry.id[:12], *reg)
    assert code == 0 and entry.sha256 in out and "_rmsnorm_kernel" in out
    code, out, _ = run(capsys, "registry", "rollback", entry.id, *reg)
    assert code == 0 and "rolled back" in out
    code, out, _ = run(capsys, "registry", "log", *reg)
    assert code == 0 and "Revert" in out
    assert registry.entries() == []
    code, _, err = run(capsys, "registry", "rollback", entry.id, *reg)  # twice: says so, not "unknown"
    assert code == 2 and f"entry {entry.id} is not in the registry any more: already rolled back" in err


def test_registry_show_flags_an_altered_source_and_uncommitted_edits(capsys, registry):
    entry = add(registry)
    reg = ("--registry", str(registry.path))
    (registry.path / entry.source_path).write_text(RMSNORM_SOURCE + "# edited\n")
    code, out, err = run(capsys, "registry", "show", entry.id, *reg)
    assert code == 0 and "# edited" not in out  # the committed source, not the working file
    assert err.startswith(f"warning: {registry.path} has uncommitted changes ({entry.source_path})")
    commit_by_hand(registry)
    code, out, err = run(capsys, "registry", "show", entry.id, *reg)
    assert code == 1 and "# edited" in out and "was altered, and the engine refuses to load it" in err
    code, out, _ = run(capsys, "registry", "show", entry.id, *reg, "--json")
    assert code == 1 and json.loads(out)["intact"] is False


def test_installed_console_script(tmp_path):
    agent = shutil.which("agent") or str(__import__("pathlib").Path(sys.executable).with_name("agent"))
    env = {**__import__("os").environ, "KERNELLOOP_REGISTRY": str(tmp_path / "r")}
    proc = subprocess.run([agent, "registry", "list"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([agent, "ops", "nope"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == "agent ops: unknown op 'nope'; known ops: " + ", ".join(OPS)


@pytest.mark.parametrize("op", list(OPS))
def test_ops_template_is_a_legal_candidate(capsys, op):
    """--template prints a self-contained starting point the static check accepts (a copy of a baseline
    module is not one: it imports the library)."""
    from kernelloop.kernels.candidate.static_check import static_check

    code, out, _ = run(capsys, "ops", "--template", op)
    assert code == 0 and f"agent check {op} THIS_FILE" in out
    assert not re.search(r"^\s*(from|import) kernels", out, re.M)
    result = static_check(out, OPS[op].arg_names)
    assert result.ok, result.reason


def test_ops_template_is_judged_correct(capsys, tmp_path):
    code, out, _ = run(capsys, "ops", "--template", "rmsnorm")
    (tmp_path / "mine.py").write_text(out)
    code, out, _ = run(capsys, "check", "rmsnorm", str(tmp_path / "mine.py"), "--no-timing", "--json",
                       "--dtypes", "float32")
    verdict = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and verdict["correct"], verdict["reason"]


def _parsers(parser, path=()):  # noqa: ANN001
    import argparse as _argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, _argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, path + (name,))


@pytest.mark.parametrize("cli", ["agent", "engine"])
def test_every_option_says_what_it_does(cli):
    """Issue #14: several flags had no help text."""
    import argparse as _argparse

    if cli == "agent":
        from kernelloop.agent.cli import build_parser
    else:
        from kernelloop.engine.cli import build_parser
    missing = [f"{cli} {' '.join(path)} {'/'.join(a.option_strings) or a.dest}"
               for path, parser in _parsers(build_parser()) for a in parser._actions
               if not a.help and not isinstance(a, (_argparse._HelpAction, _argparse._SubParsersAction))]
    assert not missing, missing
