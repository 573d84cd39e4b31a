"""The sandbox's messages: every kind declared once (sandbox/messages.py), used on both sides, and a
child's reply whose keys or value types are not exactly the declared ones refused, never a KeyError."""

from __future__ import annotations

import ast
import copy
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from kernelloop.kernels.device import CPU, Device
from kernelloop.kernels.ops import get_op
from kernelloop.sandbox import CheckOptions, Sandbox, messages, wire
from kernelloop.sandbox.inside import capture
from kernelloop.sandbox.judge.children import Child, Refused
from kernelloop.sandbox.judge.forkserver import ForkServer

REPO = Path(__file__).resolve().parents[1]
SANDBOX = REPO / "sandbox"

FACTS = {"error": None, "memory": False, "launches": 1, "torch_ops": [], "violations": [], "count": 1,
         "types": ["Tensor"], "devices": ["cpu"]}
RECORD = {"entries": [], "outputs": [{"buf": 2, "offset": 0, "shape": [4], "stride": [1], "dtype": "float32"}],
          "inputs": 2, "problem": None}
FIELDS = {"kernel": "_k", "registers": 40, "spill_bytes": 0, "stack_bytes": 0, "shared_bytes": 0, "num_warps": 4,
          "num_stages": 3, "constexprs": {"BLOCK": 64}, "seconds": 0.5, "error": None}
# One well-formed example of every kind a child sends.
FROM_CHILD = {
    "ready": {"type": "ready", "isolation": {"namespaces": "user, net"}},
    "load": {"type": "load", "ok": True, "error": None, "constants": {"BLOCK": 64}, "violations": []},
    "error": {"type": "error", "error": "RuntimeError: boom", "violations": []},
    "result": {"type": "result", "facts": FACTS, "record": RECORD, "outputs": 1},
    "staged": {"type": "staged"},
    "done": {"type": "done", "elapsed_s": None, "error": None, "outputs": 1, "violations": []},
    "captured": {"type": "captured", "shapes": [{"launches": [{"kernel": "_k", "args": [], "kwargs": {}}],
                                                 "error": None}], "violations": []},
    "compiled": {"type": "compiled", "launches": [{"compiled": 0, "ident": "[]", "error": None}],
                 "results": [{"sm90": FIELDS}]},
}


def test_every_kind_is_declared_once_with_its_own_type_tag() -> None:
    assert set(FROM_CHILD) == {messages.typing.get_type_hints(cls)["type"].__args__[0] for cls in messages.FROM_CHILD}
    assert set(messages.KINDS) == set(FROM_CHILD) | {"call", "stage", "go", "capture", "compile"}
    for kind, example in FROM_CHILD.items():
        assert messages.parse({**example, "tensors": []}, kind) == example


def _sandbox_sources() -> list[tuple[str, ast.AST]]:
    return [(str(p.relative_to(SANDBOX)), ast.parse(p.read_text())) for p in sorted(SANDBOX.rglob("*.py"))
            if p.name != "messages.py" and "cluster" not in p.parts]


def test_no_message_is_written_as_a_bare_dict_outside_messages_py() -> None:
    """Every message is built from its declared type (`Result(type="result", ...)`), so a key written in
    one file and read in another has one definition; every kind a reader asks for is declared."""
    for name, tree in _sandbox_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                assert "type" not in keys, f"{name}:{node.lineno}: a message written as a bare dict"
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("parse", "expect"):
                kinds = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                assert all(k in messages.KINDS for k in kinds), f"{name}:{node.lineno}: undeclared kind in {kinds}"


@pytest.mark.parametrize("kind", sorted(FROM_CHILD))
def test_a_reply_with_a_missing_or_undeclared_key_or_a_wrong_type_is_refused_not_a_key_error(kind: str) -> None:
    example = FROM_CHILD[kind]
    for key in [k for k in example if k != "type"]:
        with pytest.raises(wire.ProtocolError, match=f"lacks its declared key '{key}'"):
            messages.parse({k: v for k, v in example.items() if k != key}, kind)
        with pytest.raises(wire.ProtocolError, match=f"\\.{key} must be"):
            messages.parse({**example, key: object()}, kind)
    with pytest.raises(wire.ProtocolError, match="undeclared key 'sneaky'"):
        messages.parse({**example, "sneaky": 1}, kind)
    with pytest.raises(wire.ProtocolError, match="expected a"):
        messages.parse(example, "go" if kind != "go" else "call")


@pytest.mark.parametrize("path, value, words", [
    (("facts", "launches"), True, "facts.launches must be int"),  # a bool is not a count
    (("facts", "torch_ops"), ["aten.add", 3], r"facts.torch_ops\[1\] must be str"),
    (("record", "inputs"), "2", "record.inputs must be int"),
    (("record", "entries"), [[]], r"record.entries\[0\] must be an object"),
    (("outputs",), 1.0, "outputs must be int"),
])
def test_nested_declared_fields_are_checked_too(path: tuple[str, ...], value: Any, words: str) -> None:
    forged = copy.deepcopy(FROM_CHILD["result"])
    target = forged
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(wire.ProtocolError, match=words):
        messages.parse(forged, "result")
    del forged["facts"]["memory"]
    with pytest.raises(wire.ProtocolError, match="facts lacks its declared key 'memory'"):
        messages.parse(forged, "result")


def _child(device: Device = CPU) -> tuple[Child, wire.Channel, list[socket.socket]]:
    """The judge's handle on a channel with no process behind it: the test plays the child."""
    ours, theirs = socket.socketpair()
    child = Child.__new__(Child)
    child.chan, child.deadline, child.device, child.busy_s = wire.Channel(ours.fileno()), time.monotonic() + 5, device, 0.0
    child._check_memory = lambda: None
    child._sent_at, child._n_inputs, child._go_at = time.monotonic(), 2, time.perf_counter()
    return child, wire.Channel(theirs.fileno()), [ours, theirs]


def test_the_judges_handles_refuse_forged_replies_before_reading_a_field() -> None:
    child, forger, sockets = _child()
    out, x, w = torch.ones(4), torch.zeros(4), torch.ones(4)
    try:
        forger.send({**FROM_CHILD["result"], "facts": {"launches": 1}}, [out, x, w])
        with pytest.raises(wire.ProtocolError, match="facts lacks its declared key"):
            child.receive_result(1 << 20)
        forger.send({**FROM_CHILD["done"], "elapsed_s": 0.0, "fast": True}, [out, x, w])
        with pytest.raises(wire.ProtocolError, match="undeclared key 'fast'"):
            child.finish_replay(1 << 20)
        forger.send({"type": "load", "ok": True})
        with pytest.raises(wire.ProtocolError, match="lacks its declared key"):
            child.expect("load")
        forger.send({"type": "error", "error": "boom"})  # an error message is held to its declaration too
        with pytest.raises(wire.ProtocolError, match="'violations'"):
            child.expect("staged")
        forger.send(FROM_CHILD["error"])
        with pytest.raises(Refused, match="boom"):
            child.expect("staged")
        forger.send(FROM_CHILD["result"], [out, x, w])  # well-formed: accepted (and still only data)
        outputs, facts, record, after = child.receive_result(1 << 20)
        assert facts == FACTS and record == RECORD and len(outputs) == 1 and len(after) == 2
    finally:
        for s in sockets:
            s.close()


def test_the_runners_capture_answer_is_as_declared() -> None:
    spec = get_op("rmsnorm")
    request = messages.Capture(type="capture", requests=[{"shape": dict(spec.test_shapes[0]), "dtype": "float32"}])
    answer = capture.answer(spec.forward, spec, request)
    assert messages.parse(answer, "captured")["shapes"][0]["launches"], answer
    refused = capture.answer(spec.forward, spec, {**request, "requests": request["requests"] * 17})
    assert messages.parse(refused, "error")["error"] == "malformed capture message"


def test_a_real_judge_sends_and_receives_only_declared_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real (confined, fork-server) judge of rmsnorm's own kernel as a candidate, timing off: every
    message crossing the judge's end of a channel, and every job, is exactly as declared."""
    sent: list[dict] = []
    received: list[dict] = []
    jobs: list[dict] = []
    real_send, real_receive, real_start = wire.Channel.send, wire.Channel.receive, ForkServer.start

    def send(self: wire.Channel, header: dict, tensors: Any = (), deadline: float | None = None) -> None:
        sent.append(copy.deepcopy(dict(header)))
        real_send(self, header, tensors, deadline)

    def receive(self: wire.Channel, *args: Any, **kwargs: Any) -> tuple[dict, list]:
        header, tensors = real_receive(self, *args, **kwargs)
        received.append(copy.deepcopy(header))
        return header, tensors

    def start(self: ForkServer, job: dict, chan_fd: int, log_fd: int) -> int:
        jobs.append(dict(job))
        return real_start(self, job, chan_fd, log_fd)

    monkeypatch.setattr(wire.Channel, "send", send)
    monkeypatch.setattr(wire.Channel, "receive", receive)
    monkeypatch.setattr(ForkServer, "start", start)
    source = (REPO / "kernels" / "ops" / "rmsnorm_kernel.py").read_text()
    with Sandbox(CheckOptions(device="cpu", timing=False, dtypes=("float32",), seed=1)) as sandbox:
        v = sandbox.judge_source("rmsnorm", source, "rmsnorm_kernel.py")
    assert v.correct and v.failure is None, v.reason
    assert {h["type"] for h in sent} == {"call", "stage", "go"}
    assert {h["type"] for h in received} == {"ready", "load", "result", "staged", "done"}
    for header in sent:
        messages.conform(header, messages.KINDS[header["type"]], "sent")
    for header in received:
        messages.parse(header, header["type"])
    assert [j["role"] for j in jobs] == ["run", "replay"]
    for job in jobs:
        messages.conform(job, messages.Job, "job")
