"""The model handlers' ``run_many`` with the real all-MiniLM-L6-v2 and a real blob store on
disk: a packed run gives each item what ``run`` gives it alone, its texts sharing the model's
batches; a document that cannot be read ends its own item only; a cancelled item is skipped."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from jobs.blobs.store import BlobNotFound, BlobStore, digest
from tests.pdf_for_tests import make_pdf
from workers import embedding
from workers.documents import UnreadableDocument
from workers.handlers import (
    JobCancelled,
    JobContext,
    LeaseLost,
    Packing,
    RetryableError,
    default_registry,
)
from workers.model_handlers import DocumentEmbedHandler, SimilarityHandler

pytestmark = [pytest.mark.integration, pytest.mark.models]

TOLERANCE = 1e-5


def contexts(kind: str, n: int) -> list[JobContext]:
    return [JobContext(job_id=f"job-{i}", attempt=1, tenant_id="t", kind=kind)
            for i in range(n)]


def close(a: Any, b: Any) -> bool:
    """Equal JSON values, their floats within ``TOLERANCE``."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= TOLERANCE
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each batch the model is given (it still embeds them)."""
    sizes: list[int] = []
    encode = embedding._encode

    def counted(texts: Sequence[str]) -> list[list[float]]:
        sizes.append(len(texts))
        return encode(texts)

    monkeypatch.setattr(embedding, "_encode", counted)
    return sizes


EVALS = [
    {"pairs": [["A man is playing a guitar.", "A man plays the guitar."],
               ["A dog runs across the field.", "An animal is outdoors."]],
     "labels": [5.0, 2.2]},
    {"pairs": [["A man is playing a guitar.", "The stock market fell sharply today."],
               ["How do I reset my password?", "What are the steps to change my password?"],
               ["The train leaves at noon.", "A cat sleeps on the windowsill."]],
     "labels": [0.3, 4.5, 0.1]},
    {"pairs": [["Kids run around on the grass.", "The children are playing in the park."]],
     "labels": [3.4]},
]


def test_a_packed_evaluation_scores_each_item_as_it_runs_alone(batches: list[int]) -> None:
    handler = SimilarityHandler()
    payloads = [handler.validate(p) for p in EVALS]
    alone = [handler.run(ctx, p) for ctx, p in zip(contexts(handler.kind, 3), payloads,
                                                   strict=True)]
    batches.clear()
    run = contexts(handler.kind, 3)
    packed = handler.run_many(run, payloads)
    assert len(packed) == 3
    for one, many in zip(alone, packed, strict=True):
        assert close(one, many), (one, many)
    # 11 distinct sentences (one shared by two items) in one batch, not three.
    assert batches == [11]
    for ctx, payload in zip(run, payloads, strict=True):
        report = ctx.last_report
        distinct = len({s for pair in payload["pairs"] for s in pair})
        assert report is not None and report.fraction == 1.0
        assert report.message == f"{distinct} of {distinct} sentences embedded"


def test_the_real_handlers_pack_by_their_own_declaration() -> None:
    registry = default_registry("")
    similarity = registry.packing("eval.similarity")
    assert similarity is not None and similarity.max_items == 64
    assert similarity.max_cost is not None
    assert similarity.cost_of(SimilarityHandler().validate(EVALS[2])) == len(
        "Kids run around on the grass.The children are playing in the park.")
    assert registry.packing("document.embed") == Packing(max_items=16)


DOCUMENTS = {
    "pdf": make_pdf(["Tierq schedules GPU jobs by tier.", "Free work ages."]),
    "text": b"Plain text about queues.\n\nA second paragraph.",
    "markdown": b"# Title\n\nSome *markdown* text.\n\n- a list item\n",
}


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BlobStore:
    """The blob store the settings name, as a worker's handler finds it."""
    for name in list(os.environ):
        if name.startswith("TIERQ_"):
            monkeypatch.delenv(name)
    url = str(tmp_path / "blobs")
    monkeypatch.setenv("TIERQ_BLOB_URL", url)
    return BlobStore(url)


def test_packed_documents_embed_each_as_it_runs_alone(
    store: BlobStore, batches: list[int],
) -> None:
    handler = DocumentEmbedHandler()  # its store from the settings
    payloads = [handler.validate({"blob": store.put(data)}) for data in DOCUMENTS.values()]
    alone = [handler.run(ctx, p) for ctx, p in zip(contexts(handler.kind, 3), payloads,
                                                   strict=True)]
    batches.clear()
    packed = handler.run_many(contexts(handler.kind, 3), payloads)
    for one, many in zip(alone, packed, strict=True):
        assert close(one, many)
        assert many["chunks"] and many["dimensions"] == 384
    assert len(batches) == 1


def test_a_document_that_cannot_be_read_ends_its_own_item_only(
    store: BlobStore, tmp_path: Path,
) -> None:
    handler = DocumentEmbedHandler()
    good = store.put(DOCUMENTS["text"])
    # A store that cannot be read at that path (an OSError other than "not found").
    unreachable = digest(b"a blob the store cannot read")
    Path(store.path_of(unreachable)).mkdir(parents=True)
    blobs = [digest(b"never stored"), good, store.put(b"%PDF-1.4\nnot really a PDF"),
             unreachable]
    outcomes = handler.run_many(contexts(handler.kind, 4), [{"blob": b} for b in blobs])
    assert isinstance(outcomes[0], BlobNotFound)
    assert isinstance(outcomes[2], UnreadableDocument)
    assert isinstance(outcomes[3], RetryableError)
    alone = handler.run(contexts(handler.kind, 1)[0], {"blob": good})
    assert close(outcomes[1], alone)


def test_a_cancelled_item_is_skipped_and_the_others_run_on(batches: list[int]) -> None:
    handler = SimilarityHandler()
    many = [[f"first item sentence {i}", f"first item other {i}"] for i in range(20)]
    payloads = [
        handler.validate({"pairs": many, "labels": [float(i) for i in range(20)]}),
        handler.validate(EVALS[0]),  # cancelled before the run starts
        handler.validate(EVALS[1]),  # cancelled once the first item is half done
    ]

    def cancel_the_third(report: Any) -> None:
        if report.fraction < 1.0:
            run[2].mark_cancelled()

    run = [JobContext(job_id=f"job-{i}", attempt=1, tenant_id="t", kind=handler.kind,
                      reporter=cancel_the_third if i == 0 else None) for i in range(3)]
    run[1].mark_cancelled()
    outcomes = handler.run_many(run, payloads)
    assert isinstance(outcomes[1], JobCancelled) and isinstance(outcomes[2], JobCancelled)
    # The first item's 40 sentences, in two batches; none of the cancelled items'.
    assert batches == [32, 8]
    assert close(outcomes[0], handler.run(contexts(handler.kind, 1)[0], payloads[0]))
    assert run[1].last_report is None and run[2].last_report is None


def test_a_stop_of_the_whole_run_raises_between_batches(batches: list[int]) -> None:
    handler = SimilarityHandler()
    pairs = [[f"sentence {i}", f"another one {i}"] for i in range(40)]
    payload = handler.validate({"pairs": pairs, "labels": [0.0] * 40})

    def lose_the_lease(report: Any) -> None:
        for ctx in run:
            ctx.mark_lease_lost()

    run = [JobContext(job_id=f"job-{i}", attempt=1, tenant_id="t", kind=handler.kind,
                      reporter=lose_the_lease) for i in range(2)]
    with pytest.raises(LeaseLost):
        handler.run_many(run, [payload, payload])
    assert batches == [32]  # stopped before the second batch
