"""The channel: layouts survive, and no input from the other side can crash or stall the reader."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time

import pytest
import torch

from kernelloop.sandbox import wire


@pytest.fixture()
def pair():
    a, b = socket.socketpair()
    yield wire.Channel(a.fileno()), b
    a.close()
    b.close()


def _frame(header: dict | bytes) -> bytes:
    data = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("!I", len(data)) + data


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64])
def test_round_trip_keeps_values_and_layout(dtype: torch.dtype) -> None:
    a, b = socket.socketpair()
    try:
        sender, reader = wire.Channel(a.fileno()), wire.Channel(b.fileno())
        base = (torch.randn(4, 10) * 100).to(dtype)
        strided = base[:, 2:7]  # a view with row stride 10 and a storage offset
        sender.send({"type": "call", "n": 1}, [strided, base.t()])
        header, (got, transposed) = reader.receive(time.monotonic() + 5)
        assert header["type"] == "call" and header["n"] == 1
        assert got.stride() == strided.stride() and got.storage_offset() == 2 and torch.equal(got, strided)
        assert torch.equal(transposed, base.t()) and transposed.stride() == (1, 10)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("payload, message", [
    (b"\xff\xfe not json", "unreadable header"),
    (b"[1, 2]", "must be an object"),
    (json.dumps({"type": 3}).encode(), "string `type`"),
    (json.dumps({"type": "result", "tensors": "x"}).encode(), "must be a list"),
    (json.dumps({"type": "result", "tensors": [{"dtype": "complex128", "shape": [1], "stride": [1],
                                                "offset": 0, "nbytes": 16}]}).encode(), "unknown tensor dtype"),
    (json.dumps({"type": "result", "tensors": [{"dtype": "float32", "shape": ["a"], "stride": [1],
                                                "offset": 0, "nbytes": 4}]}).encode(), "integer"),
    (json.dumps({"type": "result", "tensors": [{"dtype": "float32", "shape": [4], "stride": [1],
                                                "offset": 0, "nbytes": 8}]}).encode(), "past its storage"),
    (json.dumps({"type": "result", "tensors": [{"dtype": "float32", "shape": [4], "stride": [-1],
                                                "offset": 0, "nbytes": 16}]}).encode(), "integer"),
    (json.dumps({"type": "result", "tensors": [{"dtype": "float32", "shape": [1 << 30], "stride": [1],
                                                "offset": 0, "nbytes": 4 << 30}]}).encode(), "integer"),
])
def test_malformed_headers_are_protocol_errors(pair, payload: bytes, message: str) -> None:
    chan, peer = pair
    peer.sendall(_frame(payload))
    with pytest.raises(wire.ProtocolError, match=message):
        chan.receive(time.monotonic() + 5, max_tensor_bytes=1 << 30)


def test_an_oversized_header_is_refused_before_it_is_read(pair) -> None:
    chan, peer = pair
    peer.sendall(struct.pack("!I", wire.MAX_HEADER_BYTES + 1))
    with pytest.raises(wire.ProtocolError, match="over the"):
        chan.receive(time.monotonic() + 5)


def test_a_tensor_announced_and_never_sent_times_out(pair) -> None:
    """The deadline applies to every read, not only to the first byte of a message."""
    chan, peer = pair
    peer.sendall(_frame({"type": "result", "tensors": [{"dtype": "float32", "shape": [1024], "stride": [1],
                                                          "offset": 0, "nbytes": 4096}]}) + b"\0" * 100)
    t0 = time.monotonic()
    with pytest.raises(wire.ChannelTimeout):
        chan.receive(time.monotonic() + 0.6)
    assert time.monotonic() - t0 < 3


def test_a_closed_peer_is_reported(pair) -> None:
    chan, peer = pair
    peer.sendall(b"\0\0")
    peer.close()
    with pytest.raises(wire.ChannelClosed):
        chan.receive(time.monotonic() + 5)


def test_on_wait_runs_while_waiting_and_may_abort(pair) -> None:
    chan, _ = pair
    calls = []

    def on_wait() -> None:
        calls.append(1)
        if len(calls) >= 2:
            raise RuntimeError("memory")

    with pytest.raises(RuntimeError, match="memory"):
        chan.receive(time.monotonic() + 10, on_wait=on_wait)
    assert len(calls) == 2


def test_a_message_over_the_tensor_budget_is_refused(pair) -> None:
    chan, peer = pair
    peer.sendall(_frame({"type": "result", "tensors": [{"dtype": "uint8", "shape": [64], "stride": [1],
                                                          "offset": 0, "nbytes": 64}] * 3}))
    with pytest.raises(wire.ProtocolError, match="more than"):
        chan.receive(time.monotonic() + 5, max_tensor_bytes=100)


def test_a_deeply_nested_header_is_a_protocol_error(pair) -> None:
    """json.loads raises RecursionError, not ValueError, on 200,000 nested brackets."""
    chan, peer = pair
    peer.sendall(_frame(b"[" * 200_000))
    with pytest.raises(wire.ProtocolError, match="RecursionError"):
        chan.receive(time.monotonic() + 5)


def test_a_peer_that_stops_reading_cannot_block_the_writer(pair) -> None:
    """A call bigger than the socket's buffer, sent to a process that never reads: the judge's
    non-blocking end gives up at the deadline instead of blocking in write() for ever."""
    chan, _ = pair
    os.set_blocking(chan.write_fd, False)
    t0 = time.monotonic()
    with pytest.raises(wire.ChannelTimeout):
        chan.send({"type": "call"}, [torch.zeros(4 << 20)], deadline=time.monotonic() + 0.6)
    assert time.monotonic() - t0 < 3


def test_a_non_blocking_end_still_carries_whole_messages() -> None:
    a, b = socket.socketpair()
    try:
        sender, reader = wire.Channel(a.fileno()), wire.Channel(b.fileno())
        os.set_blocking(a.fileno(), False)
        os.set_blocking(b.fileno(), False)
        big = torch.arange(3 << 20, dtype=torch.float32)  # 12 MiB: many partial writes and reads
        got = {}
        t = threading.Thread(target=lambda: got.update(msg=reader.receive(time.monotonic() + 20, 1 << 30)))
        t.start()
        sender.send({"type": "call"}, [big], deadline=time.monotonic() + 20)
        t.join(20)
        assert torch.equal(got["msg"][1][0], big)
    finally:
        a.close()
        b.close()
