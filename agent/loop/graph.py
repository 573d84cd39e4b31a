"""The tune loop as a langgraph StateGraph, checkpointed to SQLite after every step.

    profile -> propose -> check (one candidate per step, until none is pending; with a
                  ^          |    cluster pool, all of the round's candidates in one step)
                  |          |-- an accepted candidate --> gate_before -> commit -> gate_after -> finish
                  |          |-- rounds left ----------> propose (with the verdicts as feedback)
                  +----------|-- otherwise -----------> finish

A round whose answers were all unusable (no candidate, but proposal verdicts) goes on to the next
round while rounds are left; a round without any answer finishes the run.

Checkpoints are written synchronously (durability="sync"), so a hard kill at any point resumes at
the step that was running; the steps themselves are idempotent (agent/loop/nodes.py).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from kernelloop.agent.loop.context import LoopContext
from kernelloop.agent.loop.nodes import Nodes
from kernelloop.agent.loop.state import TuneSettings, TuneState
from kernelloop.agent.loop.winners import winners

RECURSION_LIMIT = 500  # steps per run: one per candidate judged, plus a handful


def _after_propose(settings: TuneSettings):
    def route(state: TuneState) -> str:
        if state.get("pending"):
            return "check"
        return "propose" if state.get("status") == "running" and state.get("round", 0) < settings.rounds else "finish"
    return route


def _after_check(settings: TuneSettings):
    def route(state: TuneState) -> str:
        if state.get("pending"):
            return "check"
        if winners(state.get("judged", []), settings.batch_invariant):
            return "gate_before"
        return "propose" if state.get("round", 0) < settings.rounds else "finish"
    return route


def build(nodes: Nodes, settings: TuneSettings):
    graph = StateGraph(TuneState)
    for name in ("profile", "propose", "check", "gate_before", "commit", "gate_after", "finish"):
        graph.add_node(name, getattr(nodes, name))
    graph.add_edge(START, "profile")
    graph.add_edge("profile", "propose")
    graph.add_conditional_edges("propose", _after_propose(settings), ["check", "propose", "finish"])
    graph.add_conditional_edges("check", _after_check(settings), ["check", "gate_before", "propose", "finish"])
    graph.add_edge("gate_before", "commit")
    graph.add_edge("commit", "gate_after")
    graph.add_edge("gate_after", "finish")
    graph.add_edge("finish", END)
    return graph


def checkpoint_path(history_path: Path) -> Path:
    return history_path.with_name(history_path.stem + "-checkpoints.db")


def unfinished_runs(ctx: LoopContext) -> list[dict[str, Any]]:
    """Tune runs that never finished (killed), newest first."""
    return [run for run in ctx.history.runs(limit=200) if run["command"] == "tune" and run["status"] == "running"]


def unfinished_run(ctx: LoopContext, op: str | None) -> int | None:
    """The newest unfinished tune run started the same way: for `op`, or (None) with the target left to
    the profile. A run for another op is never resumed in its place."""
    return next((run["id"] for run in unfinished_runs(ctx) if run["op"] == op), None)


def checkpointed_op(ctx: LoopContext, run_id: int) -> str | None:
    """The op an unfinished run's last checkpoint holds (None: no checkpoint, or no target chosen yet)."""
    path = checkpoint_path(ctx.history.path)
    if not path.exists():
        return None
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        saved = SqliteSaver(conn).get_tuple({"configurable": {"thread_id": f"tune-{run_id}"}})
        return (saved.checkpoint.get("channel_values") or {}).get("op") or None if saved else None
    finally:
        conn.close()


def run_tune(settings: TuneSettings, ctx: LoopContext, resume: int | None = None) -> dict[str, Any]:
    """Run (or resume) one tune; returns the final state."""
    conn = sqlite3.connect(checkpoint_path(ctx.history.path), check_same_thread=False)
    try:
        graph = build(Nodes(ctx, settings), settings).compile(checkpointer=SqliteSaver(conn))
        if resume is not None:
            config = {"configurable": {"thread_id": f"tune-{resume}"}, "recursion_limit": RECURSION_LIMIT}
            snapshot = graph.get_state(config)
            # `next` leaves out a step whose writes were saved before the kill and its checkpoint not: it is
            # still among `tasks`, and invoking resumes past it with those writes
            if snapshot.next or snapshot.tasks:
                op = (snapshot.values or {}).get("op") or "target not chosen yet"
                at = (snapshot.next or tuple(t.name for t in snapshot.tasks))[0]
                ctx.progress(f"resuming tune run {resume} ({op}, at {at}); --restart abandons it")
                return graph.invoke(None, config, durability="sync")
            if not snapshot.values:  # killed before its first checkpoint: start it again, as itself
                ctx.progress(f"restarting tune run {resume}: it was stopped before its first step")
                return graph.invoke({"run_id": resume, "op": settings.op or ""}, config, durability="sync")
            ctx.history.finish_run(resume, "failed", {"reason": "no checkpoint to resume"})
        run_id = ctx.history.start_run("tune", settings.op)
        config = {"configurable": {"thread_id": f"tune-{run_id}"}, "recursion_limit": RECURSION_LIMIT}
        return graph.invoke({"run_id": run_id, "op": settings.op or ""}, config, durability="sync")
    finally:
        conn.close()
