"""The channel between the judge and a sandboxed process: framed JSON headers and raw tensor bytes.

Never pickle. A message is a 4-byte big-endian length, a JSON header (an object with a string
`type`), then, for each entry of the header's `tensors` list, the raw bytes of that tensor's
storage. A tensor travels with its layout (dtype, shape, stride, storage offset, storage size), so a
strided view arrives as the same strided view.

The reading side trusts nothing: every header field is type-checked, every size is capped before a
byte is read, and every read runs against a deadline. A peer that sends garbage or stalls in the
middle of a message becomes a `ProtocolError` or a `ChannelTimeout`, never a hang or a crash.
"""

from __future__ import annotations

import json
import math
import os
import select
import struct
import time
from typing import Any, Callable, Sequence

import torch

MAX_HEADER_BYTES = 8 << 20
MAX_TENSOR_BYTES = 1 << 31
MAX_TENSORS = 64
MAX_DIMS = 8
_LEN = struct.Struct("!I")

# The only dtypes that cross the channel (op inputs and outputs, index tensors).
WIRE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "float8_e4m3fn": torch.float8_e4m3fn,  # linear_fp8's weight
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool,
}
WIRE_NAMES: dict[torch.dtype, str] = {v: k for k, v in WIRE_DTYPES.items()}


class ProtocolError(Exception):
    """The peer sent something malformed: the message is refused, the peer's verdict is `crash`."""


class ChannelTimeout(Exception):
    """The deadline passed before a whole message arrived."""


class ChannelClosed(Exception):
    """The peer closed its end (it exited or died)."""


def tensor_meta(t: torch.Tensor) -> dict[str, Any]:
    if t.dtype not in WIRE_NAMES:
        raise ProtocolError(f"dtype {t.dtype} cannot cross the channel")
    return {"dtype": WIRE_NAMES[t.dtype], "shape": list(t.shape), "stride": list(t.stride()),
            "offset": t.storage_offset(), "nbytes": t.untyped_storage().nbytes()}


def storage_bytes(t: torch.Tensor) -> bytes:
    storage = t.untyped_storage()
    if storage.device.type != "cpu":
        storage = storage.cpu()
    if storage.nbytes() == 0:
        return b""
    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy().tobytes()


def _int(value: Any, what: str, lo: int = 0, hi: int = 1 << 62) -> int:
    if type(value) is not int or not lo <= value <= hi:
        shown = repr(value)[:40] if isinstance(value, (int, float, str)) else type(value).__name__
        raise ProtocolError(f"{what} must be an integer in [{lo}, {hi}], got {shown}")
    return value


def check_meta(meta: Any, max_bytes: int = MAX_TENSOR_BYTES) -> tuple[torch.dtype, list[int], list[int], int, int]:
    """Validate one tensor description: (dtype, shape, stride, offset, nbytes), or ProtocolError."""
    if not isinstance(meta, dict):
        raise ProtocolError("a tensor description must be an object")
    dtype = WIRE_DTYPES.get(meta.get("dtype")) if isinstance(meta.get("dtype"), str) else None
    if dtype is None:
        raise ProtocolError(f"unknown tensor dtype {str(meta.get('dtype'))[:40]!r}")
    shape, stride = meta.get("shape"), meta.get("stride")
    if not isinstance(shape, list) or not isinstance(stride, list) or len(shape) != len(stride) or len(shape) > MAX_DIMS:
        raise ProtocolError("tensor shape and stride must be lists of the same length (at most 8)")
    shape = [_int(d, "a dimension", 0, 1 << 40) for d in shape]
    stride = [_int(s, "a stride", 0, 1 << 40) for s in stride]
    offset = _int(meta.get("offset"), "a storage offset", 0, 1 << 40)
    nbytes = _int(meta.get("nbytes"), "a storage size", 0, max_bytes)
    if nbytes % dtype.itemsize:
        raise ProtocolError("storage size is not a whole number of elements")
    if math.prod(shape) > 0 and offset + sum((d - 1) * s for d, s in zip(shape, stride)) >= nbytes // dtype.itemsize:
        raise ProtocolError(f"tensor {shape} with strides {stride} reaches past its storage of {nbytes} bytes")
    return dtype, shape, stride, offset, nbytes


def build_tensor(meta: dict, frame: bytes) -> torch.Tensor:
    dtype, shape, stride, offset, nbytes = check_meta(meta)
    if len(frame) != nbytes:
        raise ProtocolError(f"tensor frame of {len(frame)} bytes, announced {nbytes}")
    raw = torch.frombuffer(bytearray(frame), dtype=torch.uint8) if frame else torch.empty(0, dtype=torch.uint8)
    return torch.empty(0, dtype=dtype).set_(raw.untyped_storage(), offset, shape, stride)


class Channel:
    """One end of a stream socket (or pipe pair) carrying messages. Not thread-safe."""

    def __init__(self, read_fd: int, write_fd: int | None = None) -> None:
        self.read_fd = read_fd
        self.write_fd = read_fd if write_fd is None else write_fd

    def send(self, header: dict[str, Any], tensors: Sequence[torch.Tensor] = (), deadline: float | None = None) -> None:
        """Write one message. With a `deadline` (the judge's side, whose socket is non-blocking) a peer
        that stops reading raises ChannelTimeout instead of blocking the writer for ever."""
        header = {**header, "tensors": [tensor_meta(t) for t in tensors]}
        data = json.dumps(header, separators=(",", ":")).encode()
        self._write(_LEN.pack(len(data)) + data, deadline)
        for t in tensors:
            self._write(storage_bytes(t), deadline)

    def _write(self, data: bytes, deadline: float | None) -> None:
        view = memoryview(data)
        while view:
            if deadline is not None:
                wait = min(0.25, deadline - time.monotonic())
                if wait <= 0:
                    raise ChannelTimeout("the deadline passed while the peer was not reading")
                if not select.select([], [self.write_fd], [], wait)[1]:
                    continue
            try:
                n = os.write(self.write_fd, view[: 1 << 20])
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                raise ChannelClosed("the peer closed the channel") from None
            view = view[n:]

    def receive(self, deadline: float | None = None, max_tensor_bytes: int = MAX_TENSOR_BYTES,
                on_wait: Callable[[], None] | None = None) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """The next whole message. `deadline` is a time.monotonic() value; `on_wait` runs about every
        0.25 s while waiting (the judge checks memory there and may raise)."""
        (n,) = _LEN.unpack(self._read(_LEN.size, deadline, on_wait))
        if n > MAX_HEADER_BYTES:
            raise ProtocolError(f"header of {n} bytes is over the {MAX_HEADER_BYTES} byte limit")
        data = self._read(n, deadline, on_wait)
        try:
            header = json.loads(data)
        except (ValueError, RecursionError, MemoryError) as exc:  # RecursionError: "[[[[..." nested deep
            raise ProtocolError(f"unreadable header ({type(exc).__name__}: {str(exc)[:80]})") from None
        if not isinstance(header, dict) or not isinstance(header.get("type"), str):
            raise ProtocolError("a header must be an object with a string `type`")
        metas = header.get("tensors", [])
        if not isinstance(metas, list) or len(metas) > MAX_TENSORS:
            raise ProtocolError("`tensors` must be a list of at most 64 descriptions")
        total = 0
        for meta in metas:  # validate every description before reading any payload
            total += check_meta(meta, max_tensor_bytes)[4]
            if total > max_tensor_bytes:
                raise ProtocolError(f"message announces more than {max_tensor_bytes} bytes of tensors")
        tensors = [build_tensor(meta, self._read(meta["nbytes"], deadline, on_wait)) for meta in metas]
        return header, tensors

    def _read(self, n: int, deadline: float | None, on_wait: Callable[[], None] | None) -> bytes:
        chunks, got = [], 0
        while got < n:
            wait = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
            if wait <= 0:
                raise ChannelTimeout("the deadline passed")
            ready, _, _ = select.select([self.read_fd], [], [], wait)
            if not ready:
                if on_wait is not None:
                    on_wait()
                continue
            try:
                chunk = os.read(self.read_fd, min(n - got, 1 << 20))
            except BlockingIOError:  # a non-blocking socket woke up with nothing to read after all
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise ChannelClosed("the peer closed the channel")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        for fd in {self.read_fd, self.write_fd}:
            try:
                os.close(fd)
            except OSError:
                pass
