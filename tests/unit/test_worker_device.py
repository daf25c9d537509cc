"""A worker's device and its default slots: named by TIERQ_DEVICE, else found (a host with
no NVIDIA driver is a CPU host without importing torch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers import embedding
from workers.registration import CPU_SLOTS, GPU_SLOTS, default_slots

pytestmark = pytest.mark.unit


def test_a_gpu_worker_takes_one_job_and_a_cpu_worker_a_few() -> None:
    assert default_slots("cuda:0") == default_slots("cuda:3") == GPU_SLOTS == 1
    assert default_slots("cpu") == CPU_SLOTS == 2


def test_the_device_named_in_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(embedding.DEVICE_ENV, "cuda:3")
    assert embedding.device() == "cuda:3"


def test_without_a_driver_the_device_is_the_cpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(embedding.DEVICE_ENV, raising=False)
    monkeypatch.setattr(embedding, "_NVIDIA_GPUS", tmp_path / "no-driver")
    assert embedding.device() == "cpu"
    (tmp_path / "no-driver").mkdir()  # a driver directory that lists no GPU
    monkeypatch.setattr(embedding, "_NVIDIA_GPUS", tmp_path / "no-driver")
    assert embedding.device() == "cpu"
