"""A step whose writes langgraph saved before a kill, but whose checkpoint it did not: `get_state().next`
leaves that step out while `tasks` still holds it, and invoking resumes past it with its saved writes.
agent/loop/graph.py run_tune resumes on `next or tasks` because of this (on `next` alone, a run killed in
that window would be marked failed and replaced by a second run)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph


class S(TypedDict, total=False):
    a: int
    b: int
    c: int


def test_a_step_saved_without_its_checkpoint_is_in_tasks_not_next_and_resumes(tmp_path: Path) -> None:
    calls: list[str] = []

    def node(name: str, value: int):
        def run(state: S) -> dict:
            calls.append(name)
            return {name: value}
        return run

    graph = StateGraph(S)
    for name, value in (("a", 1), ("b", 2), ("c", 3)):
        graph.add_node(name, node(name, value))
    graph.add_edge(START, "a")
    graph.add_edge("a", "b")
    graph.add_edge("b", "c")
    graph.add_edge("c", END)
    conn = sqlite3.connect(tmp_path / "cp.db", check_same_thread=False)
    saver = SqliteSaver(conn)
    app = graph.compile(checkpointer=saver, interrupt_before=["b"])
    config = {"configurable": {"thread_id": "t"}}
    app.invoke({}, config, durability="sync")
    snapshot = app.get_state(config)
    assert snapshot.next == ("b",)
    # b ran and its writes were saved; the kill came before the checkpoint after it
    task = snapshot.tasks[0]
    saver.put_writes(snapshot.config, [("b", 2), ("branch:to:c", None)], task.id)
    snapshot = app.get_state(config)
    assert snapshot.next == () and [t.name for t in snapshot.tasks] == ["b"]
    final = app.invoke(None, config, durability="sync")
    assert final == {"a": 1, "b": 2, "c": 3} and calls == ["a", "c"]  # b's saved writes used, b not run again
    conn.close()
