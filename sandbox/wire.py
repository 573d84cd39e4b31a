"""The channel between the judge and a candidate's process: length-framed bytes, never pickle.

The judge reads only JSON headers and raw tensor bytes from the candidate's side, so nothing the
candidate's process sends can run code in the judge. Tensors travel as their raw bytes plus
(shape, dtype) from a fixed list; sizes are checked against the header before anything is built.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

from kernels.spec import DTYPES_BY_NAME, dtype_name

MAX_TENSOR_BYTES = 1 << 30


class ProtocolError(Exception):
    pass


def tensor_meta(t: torch.Tensor) -> dict[str, Any]:
    name = dtype_name(t.dtype) if t.dtype in (torch.float32, torch.float16, torch.bfloat16) else str(t.dtype)
    return {"shape": list(t.shape), "dtype": name, "nbytes": t.numel() * t.element_size()}


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def send(conn: Any, header: dict[str, Any], tensors: list[torch.Tensor] = ()) -> None:
    """One message: a JSON header (with `tensors`: their metas), then one frame per tensor."""
    header = {**header, "tensors": [tensor_meta(t) for t in tensors]}
    conn.send_bytes(json.dumps(header).encode())
    for t in tensors:
        conn.send_bytes(tensor_bytes(t))


def receive(conn: Any) -> tuple[dict[str, Any], list[torch.Tensor | None]]:
    """The next message; tensors of an unknown dtype come back as None (the judge reports them)."""
    try:
        header = json.loads(conn.recv_bytes(1 << 20))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"unreadable message ({exc})") from None
    if not isinstance(header, dict) or not isinstance(header.get("tensors", []), list):
        raise ProtocolError("malformed message")
    tensors: list[torch.Tensor | None] = []
    for meta in header.get("tensors", []):
        frame = conn.recv_bytes(MAX_TENSOR_BYTES)
        tensors.append(_decode(meta, frame))
    return header, tensors


def _decode(meta: Any, frame: bytes) -> torch.Tensor | None:
    try:
        shape = [int(d) for d in meta["shape"]]
        dtype = DTYPES_BY_NAME.get(meta["dtype"])
    except (KeyError, TypeError, ValueError):
        raise ProtocolError("malformed tensor header") from None
    if dtype is None:
        return None
    if any(d < 0 for d in shape) or math.prod(shape) * dtype.itemsize != len(frame):
        raise ProtocolError(f"tensor frame of {len(frame)} bytes does not match shape {shape} {meta['dtype']}")
    if not frame:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(frame), dtype=torch.uint8).view(dtype).reshape(shape)
