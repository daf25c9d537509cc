"""The handlers of the ``models`` extra: ``document.embed`` and ``eval.similarity``.

They reach the registry through tierq's own entry point (group ``tierq.handlers``), the
door any package's handlers use; without the extra ``installed_handlers()`` is empty and the
kinds are unknown (422 at submit, naming the known kinds): no job is accepted that no worker runs.

Both embed through ``workers.embedding`` (one model per process, loaded by their ``setup()``
before the worker takes a job; batches on its device) and check for a cancel between
batches. A blob store that cannot be reached is retryable; a
document that cannot be read, or a blob that is gone, is not.

Both pack (``run_many``): the texts of every item of a run share the model's batches, so
many small evaluations or documents cost a GPU little more than one. Each item's result is
the one ``run`` gives it alone; a document that cannot be read ends its own item only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from jobs.blobs.store import SHA256, BlobNotFound, BlobStore
from jobs.core.errors import InvalidRequest
from jobs.process.settings import load_settings
from workers import embedding
from workers.documents import chunk_text, extract_text
from workers.handlers import (
    Handler,
    JobCancelled,
    JobContext,
    RetryableError,
    check_run,
    parse_payload,
)

MAX_PAIRS = 10_000
MAX_SENTENCE_CHARS = 10_000


class _EmbedPayload(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    blob: Annotated[str, StringConstraints(pattern=SHA256.pattern)]


class DocumentEmbedHandler:
    """Chunks a stored document and embeds each chunk.

    ``store``: the blob store (default: the one the settings name, built on first use)."""

    kind = "document.embed"
    # A payload names its blob only, so a run is bounded by its count of documents (a
    # document is up to ``api.max_document_bytes``: no budget can be told before reading).
    max_items_per_run = 16

    def __init__(self, store: BlobStore | None = None) -> None:
        self._store = store

    def setup(self) -> None:
        """Load the model before the worker takes a job (once per process)."""
        embedding.model()

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        return parse_payload(_EmbedPayload, payload)

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        chunks = self._chunks(payload)
        vectors = embedding.embed(chunks, between_batches=ctx.check,
                                  on_progress=reporter(ctx, "chunks embedded"))
        return _embedded(chunks, vectors)

    def run_many(self, contexts: list[JobContext], payloads: list[dict[str, Any]]) -> list[Any]:
        """Every document's chunks through the model together. A document that cannot be
        read (gone, not a document, a bad PDF) or a store that cannot be reached (retryable)
        is its own item's outcome; the others run on."""
        outcomes: list[Any] = [None] * len(payloads)
        chunks: list[list[str]] = [[] for _ in payloads]
        for index, payload in enumerate(payloads):
            if index not in check_run(contexts):
                continue
            try:
                chunks[index] = self._chunks(payload)
            except Exception as exc:  # that document's failure, not the run's
                outcomes[index] = exc
        vectors = embedding.embed_many(
            chunks, wanted=lambda: check_run(contexts),
            on_progress=item_reporter(contexts, "chunks embedded"))
        still = set(check_run(contexts))
        for index, ctx in enumerate(contexts):
            if outcomes[index] is not None:
                continue
            encoded = vectors[index]
            outcomes[index] = (_embedded(chunks[index], encoded)
                               if index in still and encoded is not None else cancelled(ctx))
        return outcomes

    def _chunks(self, payload: dict[str, Any]) -> list[str]:
        _, text = extract_text(self._read(str(payload["blob"])))
        return chunk_text(text)

    def _read(self, sha256: str) -> bytes:
        if self._store is None:
            self._store = BlobStore.from_settings(load_settings())
        try:
            return self._store.get(sha256)
        except BlobNotFound:
            raise
        except OSError as exc:
            raise RetryableError(f"the blob store cannot be read: {exc}") from exc


def _embedded(chunks: list[str], vectors: list[list[float]]) -> dict[str, Any]:
    return {
        "chunks": [{"text": c, "embedding": v} for c, v in zip(chunks, vectors, strict=True)],
        "model": embedding.MODEL_NAME,
        "dimensions": embedding.DIMENSIONS,
    }


Sentence = Annotated[str, StringConstraints(min_length=1, max_length=MAX_SENTENCE_CHARS)]
Label = Annotated[float, Field(allow_inf_nan=False)]
Pair = Annotated[list[Sentence], Field(min_length=2, max_length=2)]


class _SimilarityPayload(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    pairs: Annotated[list[Pair], Field(min_length=1, max_length=MAX_PAIRS)]
    labels: Annotated[list[Label], Field(max_length=MAX_PAIRS)]


class SimilarityHandler:
    """Cosine similarity of each pair, and Spearman's rank correlation with the labels
    (null when either side is constant: no ranking to compare)."""

    kind = "eval.similarity"
    max_items_per_run = 64
    # In characters of the pairs' sentences: about 3,000 short sentences, a second or so of a
    # GPU and some 10 s of a CPU, so the items riding with a run's first wait little for it.
    max_cost_per_run = 200_000

    def cost(self, payload: dict[str, Any]) -> int:
        return sum(len(a) + len(b) for a, b in payload["pairs"])

    def setup(self) -> None:
        """Load the model before the worker takes a job (once per process)."""
        embedding.model()

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        normalised = parse_payload(_SimilarityPayload, payload)
        pairs, labels = len(normalised["pairs"]), len(normalised["labels"])
        if labels != pairs:
            msg = f"{labels} labels for {pairs} pairs: give one label per pair"
            raise InvalidRequest(f"invalid payload: payload.labels: {msg}",
                                 details=[{"loc": ["payload", "labels"], "msg": msg}])
        return normalised

    def run(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        sentences = _sentences(payload)
        encoded = embedding.embed(sentences, between_batches=ctx.check,
                                  on_progress=reporter(ctx, "sentences embedded"))
        return _scored(payload, sentences, encoded)

    def run_many(self, contexts: list[JobContext], payloads: list[dict[str, Any]]) -> list[Any]:
        """Every item's distinct sentences through the model together (one shared by
        several items, once); each item scored on its own."""
        wanted = set(check_run(contexts))
        sentences = [_sentences(p) if i in wanted else [] for i, p in enumerate(payloads)]
        vectors = embedding.embed_many(
            sentences, wanted=lambda: check_run(contexts),
            on_progress=item_reporter(contexts, "sentences embedded"))
        still = set(check_run(contexts))
        return [
            _scored(payload, sentences[i], encoded)
            if i in still and (encoded := vectors[i]) is not None else cancelled(ctx)
            for i, (ctx, payload) in enumerate(zip(contexts, payloads, strict=True))
        ]


def _sentences(payload: dict[str, Any]) -> list[str]:
    return sorted({s for pair in payload["pairs"] for s in pair})


def _scored(payload: dict[str, Any], sentences: list[str],
            encoded: list[list[float]]) -> dict[str, Any]:
    vectors = dict(zip(sentences, encoded, strict=True))
    scores = [_dot(vectors[a], vectors[b]) for a, b in payload["pairs"]]
    return {"scores": scores, "spearman": spearman(scores, payload["labels"])}


def reporter(ctx: JobContext, what: str) -> Callable[[int, int], None]:
    """``embed``'s progress as the job's (``ctx.progress``): "12 of 40 chunks embedded"."""

    def report(done: int, total: int) -> None:
        ctx.progress(done / total if total else 1.0, f"{done} of {total} {what}")

    return report


def item_reporter(contexts: list[JobContext], what: str) -> Callable[[int, int, int], None]:
    """``embed_many``'s progress as each item's own: its texts done of its total."""

    def report(index: int, done: int, total: int) -> None:
        reporter(contexts[index], what)(done, total)

    return report


def cancelled(ctx: JobContext) -> JobCancelled:
    """The outcome of an item cancelled while its run went on."""
    return JobCancelled(f"job {ctx.job_id} was cancelled")


def _dot(a: list[float], b: list[float]) -> float:
    """The embeddings are unit length: their dot product is the cosine."""
    return max(-1.0, min(1.0, math.fsum(x * y for x, y in zip(a, b, strict=True))))


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho (Pearson's r of the ranks, ties ranked by their mean)."""
    if len(xs) != len(ys) or len(xs) < 2:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = math.fsum(rx) / len(rx), math.fsum(ry) / len(ry)
    cov = math.fsum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = math.fsum((a - mx) ** 2 for a in rx)
    vy = math.fsum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return None
    return cov / math.sqrt(vx * vy)


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def installed_handlers() -> list[Handler]:
    """The handlers of this module when the ``models`` extra is installed, else none."""
    if not embedding.models_installed():
        return []
    return [DocumentEmbedHandler(), SimilarityHandler()]
