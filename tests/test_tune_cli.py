"""`agent tune`'s bookkeeping around runs: which unfinished run it resumes, and how to list them.

Issue #14: `agent tune` with no op silently resumed an older unfinished run for another op.
"""

from __future__ import annotations

import json
from pathlib import Path

from kernelloop.agent.cli import main
from kernelloop.agent.loop.context import LoopContext
from kernelloop.agent.loop.graph import unfinished_run
from kernelloop.history import History
from kernelloop.kernels.registry import Registry


def test_a_run_for_another_op_is_never_resumed_in_its_place(tmp_path: Path, capsys) -> None:
    with History(tmp_path / "h.db") as history:
        ctx = LoopContext(history=history, registry=Registry(tmp_path / "reg"), proposers={})
        rope = history.start_run("tune", "rope")
        auto = history.start_run("tune", None)
        done = history.start_run("tune", "rmsnorm")
        history.finish_run(done, "winner")
        assert unfinished_run(ctx, None) == auto  # started the same way: target from the profile
        assert unfinished_run(ctx, "rope") == rope
        assert unfinished_run(ctx, "rmsnorm") is None and unfinished_run(ctx, "silu_mul") is None
    assert main(["tune", "--unfinished", "--history", str(tmp_path / "h.db"), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["id"], r["asked_op"], r["resume_with"]) for r in listed] == [
        (auto, None, "agent tune"), (rope, "rope", "agent tune rope")]
    assert main(["tune", "--unfinished", "--history", str(tmp_path / "h.db")]) == 0
    assert "2 unfinished tune runs" in capsys.readouterr().out


def test_a_committed_kernel_says_how_to_serve_it() -> None:
    """Issue #14: after `agent tune` committed a kernel, `engine serve` (reference ops on CPU by default)
    did not use it and nothing said so."""
    import argparse

    from kernelloop.agent.commands.tune import serving_hint

    state = {"op": "rmsnorm", "committed": {"entry_id": "rmsnorm-abc"}}
    local = serving_hint(state, argparse.Namespace(engine=None, model="smollm2"), "/r", "/m")
    assert local.startswith("to serve it: engine serve --kernels registry --registry /r --model smollm2")
    assert 'variant="registry:rmsnorm-abc"' in local
    remote = serving_hint(state, argparse.Namespace(engine=["http://h:1"], model=None), "/r", "/m")
    assert remote.startswith("http://h:1 serves it now (reloaded)")
    fleet = serving_hint(state, argparse.Namespace(engine=["http://h:1", "http://h:2"], model=None), "/r", "/m")
    assert fleet.startswith("http://h:1, http://h:2 serve it now (reloaded)")
