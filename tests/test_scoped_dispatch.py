"""Scoped dispatch: a projection named by its scope is served through its quantization scheme's op when a plan or
the registry's scoped entries say so, and by the op `linear` otherwise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernelloop.kernels.dispatch import Dispatcher
from kernelloop.kernels.ops import baseline_source
from kernelloop.kernels.quant import SCHEMES
from kernelloop.kernels.registry import ANY_BUCKET, Entry, Provenance
from kernelloop.kernels.registry.entry import sha256_text, utc_now

SCOPE = "layers.0.down_proj"


def tensors(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, 128, generator=g), torch.randn(40, 128, generator=g) / 11


def quantized_reference(x: torch.Tensor, w: torch.Tensor, scheme: str) -> torch.Tensor:
    s = SCHEMES[scheme]
    return F.linear(x, s.dequantize(*s.quantize(w)))


def scoped(scheme: str, scope: str, device: str = "cpu-interpreter", dtype: str = "float32") -> tuple[Entry, str]:
    source = baseline_source(SCHEMES[scheme].op)
    entry = Entry(op=SCHEMES[scheme].op, device=device, dtype=dtype, bucket=ANY_BUCKET, sha256=sha256_text(source),
                  speedup=1.0, speedup_ci=(1.0, 1.0), provenance=Provenance("quantize"), verified_at=utc_now(),
                  scope=scope)
    return entry, source


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_plan_quantizes_its_scopes_only(scheme):
    kd = Dispatcher("reference")
    x, w = tensors()
    plain = kd.linear_at(SCOPE, x, w, None)
    torch.testing.assert_close(plain, F.linear(x, w))
    kd.set_quant_plan({SCOPE: scheme})
    torch.testing.assert_close(kd.linear_at(SCOPE, x, w, None), quantized_reference(x, w, scheme))
    assert not torch.allclose(kd.linear_at(SCOPE, x, w, None), plain, atol=1e-4, rtol=0)
    torch.testing.assert_close(kd.linear_at("layers.1.down_proj", x, w, None), plain)  # another scope: unquantized
    assert kd.variants_in_use()[f"{SCHEMES[scheme].op}@{SCOPE}"] == {"float32 k=128,n=40,tokens=2-16": "reference"}
    kd.set_quant_plan({})
    torch.testing.assert_close(kd.linear_at(SCOPE, x, w, None), plain)


def test_a_weight_changed_in_place_is_quantized_again():
    kd = Dispatcher("reference")
    kd.set_quant_plan({SCOPE: "int8"})
    x, w = tensors()
    kd.linear_at(SCOPE, x, w, None)
    w.mul_(2)
    torch.testing.assert_close(kd.linear_at(SCOPE, x, w, None), quantized_reference(x, w, "int8"))


def test_the_registrys_scoped_entries_serve_their_scopes_and_reload_sees_a_new_selection(registry):
    kd = Dispatcher("registry", registry=registry, fallback="reference")
    x, w = tensors()
    torch.testing.assert_close(kd.linear_at(SCOPE, x, w, None), F.linear(x, w))
    first = registry.replace_scoped("cpu-interpreter", "float32", [scoped("int8", SCOPE)], "quantize 1")
    changed = kd.reload()
    assert changed["quantized scopes"] == {"selection": ("0 scoped entries", "1 scoped entries")}
    y = kd.linear_at(SCOPE, x, w, None)
    torch.testing.assert_close(y, quantized_reference(x, w, "int8"), atol=1e-5, rtol=1e-5)
    entry = registry.entries()[0]
    assert kd.variants_in_use()[f"linear_int8@{SCOPE}"] == {"float32 k=128,n=40,tokens=2-16": f"registry:{entry.id}"}
    torch.testing.assert_close(kd.linear_at("lm_head", x, w, None), F.linear(x, w))  # not in the selection
    torch.testing.assert_close(kd.linear(x, w, None), F.linear(x, w))  # unscoped calls never see scoped entries

    registry.rollback(first)
    assert kd.reload()["quantized scopes"] == {"selection": ("1 scoped entries", "0 scoped entries")}
    torch.testing.assert_close(kd.linear_at(SCOPE, x, w, None), F.linear(x, w))


def test_scoped_entries_of_another_device_or_dtype_are_not_served(registry):
    registry.replace_scoped("NVIDIA H200 sm90", "float32", [scoped("int8", SCOPE, device="NVIDIA H200 sm90")], "gpu")
    registry.replace_scoped("cpu-interpreter", "bfloat16", [scoped("int8", SCOPE, dtype="bfloat16")], "bf16")
    kd = Dispatcher("registry", registry=registry, fallback="reference")
    x, w = tensors()
    torch.testing.assert_close(kd.linear_at(SCOPE, x, w, None), F.linear(x, w))
    assert len(registry.entries()) == 2  # each replace_scoped kept the other (device, dtype)'s selection


def test_a_scoped_entry_id_differs_from_an_unscoped_one_of_the_same_source():
    a, _ = scoped("int8", SCOPE)
    b, _ = scoped("int8", "lm_head")
    plain = Entry(**{**a.__dict__, "scope": ""})
    assert len({a.id, b.id, plain.id}) == 3
    assert "scope" not in plain.to_dict() and a.to_dict()["scope"] == SCOPE
    assert Entry.from_dict(a.to_dict(), "test") == a
