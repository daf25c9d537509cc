"""The model handlers with the real all-MiniLM-L6-v2 on this machine's device, a real blob
store on disk, and the handler registry as a worker builds it (entry points included)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.blobs.store import BlobNotFound, BlobStore, digest
from tests.pdf_for_tests import make_pdf
from workers import embedding
from workers.handlers import JobCancelled, JobContext, default_registry
from workers.model_handlers import DocumentEmbedHandler, SimilarityHandler

pytestmark = [
    pytest.mark.integration,
    pytest.mark.models,
]

# Five pairs from "very close" to "unrelated", with labels of that order (0–5, as in STS-B).
LABELLED = [
    (("A man is playing a guitar.", "A man plays the guitar."), 5.0),
    (("A woman is slicing an onion.", "Someone is cutting an onion with a knife."), 4.2),
    (("The children are playing in the park.", "Kids run around on the grass outside."), 3.4),
    (("A dog runs across the field.", "An animal is outdoors."), 2.2),
    (("The stock market fell sharply today.", "A cat sleeps on the windowsill."), 0.1),
]
# Spearman's rho that a working sentence model reaches on this set: it is 1.0 when the
# model ranks the five like the labels; a random or broken one averages 0.
SPEARMAN_FLOOR = 0.8


def context(kind: str) -> JobContext:
    return JobContext(job_id="job", attempt=1, tenant_id="tenant", kind=kind)


def similarity(payload: dict[str, object]) -> dict[str, object]:
    handler = SimilarityHandler()
    result: dict[str, object] = handler.run(context(handler.kind), handler.validate(payload))
    return result


def test_a_paraphrase_scores_higher_than_an_unrelated_pair() -> None:
    result = similarity({
        "pairs": [["How do I reset my password?", "What are the steps to change my password?"],
                  ["How do I reset my password?", "The train to Paris leaves at noon."]],
        "labels": [1.0, 0.0],
    })
    paraphrase, unrelated = result["scores"]  # type: ignore[misc]
    assert paraphrase > unrelated + 0.3
    assert -1.0 <= unrelated < paraphrase <= 1.0


def test_a_labelled_set_ranks_like_its_labels() -> None:
    result = similarity({"pairs": [list(p) for p, _ in LABELLED],
                         "labels": [label for _, label in LABELLED]})
    assert len(result["scores"]) == len(LABELLED)  # type: ignore[arg-type]
    assert isinstance(result["spearman"], float)
    assert result["spearman"] >= SPEARMAN_FLOOR


def test_documents_of_each_type_are_chunked_and_embedded(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path / "blobs"))
    handler = DocumentEmbedHandler(store)
    documents = {
        "pdf": make_pdf(["Tierq schedules GPU jobs by tier.", "Free work ages."]),
        "text": b"Plain text about queues.\n\nA second paragraph.",
        "markdown": b"# Title\n\nSome *markdown* text.\n\n- a list item\n",
    }
    for name, data in documents.items():
        sha256 = store.put(data)
        result = handler.run(context(handler.kind), handler.validate({"blob": sha256}))
        assert result["model"] == embedding.MODEL_NAME, name
        assert result["dimensions"] == embedding.DIMENSIONS == 384
        chunks = result["chunks"]
        assert chunks, name
        text = " ".join(c["text"] for c in chunks)
        for chunk in chunks:
            assert len(chunk["embedding"]) == 384
            assert sum(x * x for x in chunk["embedding"]) == pytest.approx(1.0, abs=1e-3)
        if name == "pdf":
            assert "GPU jobs" in text and "Free work ages." in text
        else:
            assert data.decode().split()[1] in text


def test_a_missing_blob_fails_the_job(tmp_path: Path) -> None:
    handler = DocumentEmbedHandler(BlobStore(str(tmp_path)))
    with pytest.raises(BlobNotFound):
        handler.run(context(handler.kind), {"blob": digest(b"never stored")})


def test_a_cancel_stops_the_work_between_batches() -> None:
    ctx = context("eval.similarity")
    ctx.mark_cancelled()
    pairs = [[f"sentence number {i}", f"another sentence {i}"] for i in range(100)]
    with pytest.raises(JobCancelled):
        SimilarityHandler().run(ctx, {"pairs": pairs, "labels": [0.0] * 100})


def test_the_model_kinds_come_from_the_entry_point() -> None:
    assert {"document.embed", "eval.similarity"} <= set(default_registry("").kinds())
    assert "document.embed" not in default_registry("", entry_points=False).kinds()


def test_the_blob_store_is_content_addressed(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    sha256 = store.put(b"hello")
    assert sha256 == digest(b"hello")
    assert store.put(b"hello") == sha256  # stored once
    assert store.get(sha256) == b"hello" and store.exists(sha256)
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [sha256]  # no temp left
    store.delete(sha256)
    assert not store.exists(sha256)
    with pytest.raises(ValueError, match="sha256"):
        store.get("../../etc/passwd")
    memory = BlobStore(f"memory://tierq-test-{sha256[:8]}")
    assert memory.get(memory.put(b"elsewhere")) == b"elsewhere"
