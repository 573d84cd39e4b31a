"""The roofline: bytes over copy bandwidth or FLOPs over matmul peak, measured once per device and dtype."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from kernelloop.kernels import roofline
from kernelloop.kernels.device import CPU, CUDA
from kernelloop.kernels.spec import Cost


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """Fixed device rates (1 GB/s copy; 10 GFLOP/s float32, 40 GFLOP/s bfloat16), counted per measurement."""
    monkeypatch.setenv("KERNELLOOP_CACHE", str(tmp_path))
    calls: list[str] = []

    def copy(device):
        calls.append("copy")
        return 1e9

    def peak(device, dtype):
        calls.append(f"matmul {dtype}")
        return {torch.float32: 10e9, torch.bfloat16: 40e9}[dtype]

    monkeypatch.setattr(roofline, "measure_copy_bandwidth", copy)
    monkeypatch.setattr(roofline, "measure_matmul_peak", peak)
    return calls


def test_a_memory_bound_call_is_held_to_its_bytes(measured):
    cost = Cost(bytes=3_000_000, flops=4_000_000)  # silu_mul-like: 4 flops per 3 bytes
    rates = roofline.device_rates(CPU, torch.float32)
    assert rates.seconds(cost) == pytest.approx(3e-3) and rates.bound(cost) == "memory"


def test_a_gemm_is_held_to_its_flops_in_its_own_dtype(measured, monkeypatch):
    monkeypatch.setattr(roofline, "device_fingerprint", lambda device: "NVIDIA H200 sm90")
    cuda = CUDA  # the measurements are faked
    m, n, k = 512, 512, 512
    cost = Cost(bytes=2 * (m * k + n * k + m * n), flops=2 * m * n * k)
    assert roofline.device_rates(cuda, torch.float32).seconds(cost) == pytest.approx(2 * m * n * k / 10e9)
    bf16 = roofline.device_rates(cuda, torch.bfloat16)
    assert bf16.seconds(cost) == pytest.approx(2 * m * n * k / 40e9) and bf16.bound(cost) == "compute"


def test_on_cpu_every_dtype_is_held_to_the_float32_matmul(measured):
    # the interpreter computes bf16 dots in float32: a slow bf16 CPU matmul must not make them "impossible"
    cost = Cost(bytes=1, flops=10**9)
    assert roofline.device_rates(CPU, torch.bfloat16).seconds(cost) == pytest.approx(0.1)


def test_each_rate_is_measured_once_per_device_and_dtype(measured, tmp_path, monkeypatch):
    monkeypatch.setattr(roofline, "device_fingerprint", lambda device: "NVIDIA H200 sm90")
    for _ in range(3):
        roofline.device_rates(CUDA, torch.float32)
        roofline.device_rates(CUDA, torch.bfloat16)
    assert sorted(measured) == ["copy", "matmul torch.bfloat16", "matmul torch.float32"]
    saved = json.loads((tmp_path / "roofline.json").read_text())
    assert saved == {"NVIDIA H200 sm90 copy": 1e9, "NVIDIA H200 sm90 matmul float32": 10e9,
                     "NVIDIA H200 sm90 matmul bfloat16": 40e9}


def test_a_damaged_cache_is_measured_again(measured, tmp_path):
    (tmp_path / "roofline.json").write_text('{"cpu-interpreter copy": -1, "cpu-interpreter matmul float32": "x"')
    assert roofline.copy_bandwidth(CPU) == 1e9
    (tmp_path / "roofline.json").write_text('{"cpu-interpreter copy": 0}')
    assert roofline.copy_bandwidth(CPU) == 1e9
    assert measured == ["copy", "copy"]


def test_the_matmul_peak_is_a_real_measurement():
    flops = roofline.measure_matmul_peak(dataclasses.replace(CPU, matmul_size=128), torch.float32)
    assert 1e7 < flops < 1e13  # a 2-core CPU: around 1e10
