"""The tune loop's engines (agent/loop/context.py): the engine being tuned and its float32 reference
must hold the same model, and the reference must be plain float32 torch, never captured in a graph."""

from __future__ import annotations

from pathlib import Path

import torch

from kernelloop.agent.loop.context import LoopContext
from kernelloop.engine.models import build_model, read_config
from kernelloop.engine.weights import init_random_weights
from kernelloop.history import History
from kernelloop.kernels.registry import Registry

from tests.hf_checkpoints import make_checkpoint


def test_random_weights_agree_across_dtypes_up_to_rounding(tmp_path: Path) -> None:
    """A bf16 engine on random weights is gated against a float32 reference on the same seed: the
    two must hold the same weights, up to bf16 rounding (not two different random models)."""
    config = read_config(make_checkpoint(tmp_path / "ckpt"))
    low, full = build_model(config, torch.bfloat16, "cpu"), build_model(config, torch.float32, "cpu")
    init_random_weights(low)
    init_random_weights(full)
    for name, tensor in full.parameters().items():
        assert torch.equal(low.parameters()[name], tensor.to(torch.bfloat16)), name


def test_the_reference_engine_is_float32_uncaptured_and_on_the_same_weights(tmp_path: Path) -> None:
    model = make_checkpoint(tmp_path / "ckpt")
    with History(tmp_path / "h.db") as history:
        ctx = LoopContext(history=history, registry=Registry(tmp_path / "reg"), proposers={}, model=str(model),
                          random_weights=True)
        try:
            reference, engine = ctx.reference.config, ctx.engine.config
            assert reference.kernels == "reference" and reference.dtype == "float32" and not reference.cuda_graphs
            assert reference.random_weights and engine.random_weights and engine.kernels == "registry"
            ref_params, eng_params = ctx.reference.engine.model.parameters(), ctx.engine.engine.model.parameters()
            assert all(torch.equal(ref_params[k], eng_params[k].float()) for k in ref_params)
        finally:
            ctx.close()
