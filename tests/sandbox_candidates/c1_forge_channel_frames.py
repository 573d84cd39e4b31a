"""Exploit: forge the judge's channel. The candidate's process talks to the judge over a socket
whose framing (4-byte big-endian length + JSON header + raw tensor bytes) is in the repository. On
every call it writes, to every socket fd from 3 to 30 (reached as torch.os.write), a forged
"result" message - facts claiming one launch, no torch ops and no violations, a record with no
problem, and as output the right answer computed with torch - plus forged "done" messages with a
zero elapsed time, then returns a wrong output (x * weight, no normalisation) through a kernel.
Gain if the judge believed the first frame on its channel: correct, and any torch compute hidden.
"""
# expect: static=static runtime=crash|mismatch|torch-compute|launch-independent|untraceable

from __future__ import annotations

import torch
import triton
import triton.language as tl

_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@triton.jit
def _scale_only(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, (x * w).to(y_ptr.dtype.element_ty), mask=mask)


def _json(v) -> str:
    """JSON without the json module (not importable in the sandbox)."""
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_json(x) for x in v) + "]"
    return "{" + ",".join(_json(str(k)) + ":" + _json(x) for k, x in v.items()) + "}"


def _meta(t: torch.Tensor) -> dict:
    return {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "stride": list(t.stride()),
            "offset": t.storage_offset(), "nbytes": t.untyped_storage().nbytes()}


def _raw(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().view(torch.uint8).reshape(-1).cpu().numpy())


def _frame(header: dict, tensors: list) -> bytes:
    header = {**header, "tensors": [_meta(t) for t in tensors]}
    data = _json(header).encode()
    return len(data).to_bytes(4, "big") + data + b"".join(_raw(t) for t in tensors)


def _forge(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    os = torch.os
    xf = x.float()
    right = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype).contiguous()
    record = {"entries": [], "outputs": [{"buf": 2, "offset": 0, "shape": list(right.shape),
                                          "stride": list(right.stride()), "dtype": _NAMES[x.dtype]}],
              "inputs": 2, "problem": None}
    facts = {"error": None, "memory": False, "launches": 1, "torch_ops": [], "violations": [], "count": 1,
             "types": ["Tensor"], "devices": ["cpu"]}  # every key sandbox/messages.py declares: well-formed
    result = _frame({"type": "result", "facts": facts, "record": record, "outputs": 1},
                    [right, x.contiguous(), weight])
    done = _frame({"type": "done", "elapsed_s": 0.0, "error": None, "outputs": 0, "violations": []}, [])
    for fd in range(3, 31):
        try:
            if (os.fstat(fd).st_mode & 0o170000) == 0o140000:  # a socket
                os.write(fd, result + done)
                print(f"forged a result on fd {fd}", flush=True)
        except OSError as exc:
            print(f"fd {fd}: {exc}", flush=True)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _forge(x, weight, eps)
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    _scale_only[(rows,)](x2, weight, y, x2.stride(0), y.stride(0), n, BLOCK=triton.next_power_of_2(n))
    return y.view(x.shape)
