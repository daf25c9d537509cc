"""Documents without a model: telling types from bytes, chunking, Spearman's rho, and the
payload checks of the model handlers (which need no model to run)."""

from __future__ import annotations

import math

import pytest

from jobs.core import content_type
from jobs.core.errors import InvalidRequest
from tests.pdf_for_tests import make_pdf
from workers.documents import UnreadableDocument, chunk_text, extract_text
from workers.model_handlers import DocumentEmbedHandler, SimilarityHandler, spearman

pytestmark = pytest.mark.unit

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00"


@pytest.mark.parametrize(
    ("data", "filename", "expected"),
    [
        (make_pdf(["hello"]), "x.txt", content_type.PDF),  # the bytes win over the name
        (b"plain words\nand more words\n", None, content_type.TEXT),
        ("caf\u00e9 na\u00efve\n".encode(), "notes.txt", content_type.TEXT),
        (b"# Title\n\nSome text.\n", None, content_type.MARKDOWN),
        (b"just text", "README.md", content_type.MARKDOWN),
        (b"- one\n- two\n", None, content_type.MARKDOWN),
        (PNG, "picture.txt", None),
        (b"\xff\xfe\x00b\x00a", None, None),  # UTF-16: not UTF-8
        (b"text\x00with a NUL", None, None),
        (b"", "empty.txt", None),
    ],
)
def test_the_type_is_told_from_the_bytes(data: bytes, filename: str | None,
                                         expected: str | None) -> None:
    assert content_type.detect(data, filename) == expected


def test_text_is_extracted_from_each_readable_type() -> None:
    assert extract_text(make_pdf(["First page.", "Second page."])) == (
        content_type.PDF, "First page.\n\nSecond page.")
    assert extract_text("\ufeffwith a BOM".encode()) == (content_type.TEXT, "with a BOM")
    with pytest.raises(UnreadableDocument):
        extract_text(PNG)
    with pytest.raises(UnreadableDocument, match="PDF"):
        extract_text(b"%PDF-1.4\nthis is no pdf at all")


def test_a_nul_in_a_pdfs_text_is_dropped() -> None:
    assert extract_text(make_pdf(["page\x00one"])) == (content_type.PDF, "pageone")


def test_chunks_follow_paragraphs_and_stay_under_the_limit() -> None:
    text = "alpha beta\n\ngamma delta\n\n" + " ".join(["word"] * 100) + "\n\n" + "x" * 130
    chunks = chunk_text(text, max_chars=50)
    assert chunks[0] == "alpha beta\n\ngamma delta"  # two short paragraphs packed together
    assert all(0 < len(c) <= 50 for c in chunks)
    assert all(c.strip() == c for c in chunks)
    assert "".join(chunks).replace("\n", "").replace(" ", "") == text.replace(
        "\n", "").replace(" ", "")  # nothing lost, nothing invented
    assert chunk_text("   \n\n  ") == []


def test_spearman_ranks_with_ties_and_is_none_without_a_ranking() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Ties take the mean rank: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4).
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    assert spearman([1.0], [2.0]) is None


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({"pairs": [["a", "b"]], "labels": [1.0, 2.0]}, "labels"),
        ({"pairs": [], "labels": []}, "pairs"),
        ({"pairs": [["a"]], "labels": [1.0]}, "pairs.0"),
        ({"pairs": [["a", "b", "c"]], "labels": [1.0]}, "pairs.0"),
        ({"pairs": [["a", ""]], "labels": [1.0]}, "pairs.0.1"),
        ({"pairs": [["a", 3]], "labels": [1.0]}, "pairs.0.1"),
        ({"pairs": [["a", "b"]], "labels": ["high"]}, "labels.0"),
        ({"pairs": [["a", "b"]], "labels": [math.inf]}, "labels.0"),
        ({"pairs": [["a", "b"]]}, "labels"),
        ({"pairs": [["a", "b"]], "labels": [1.0], "extra": 1}, "extra"),
        ({"pairs": [["a", "b" * 10_001]], "labels": [1.0]}, "pairs.0.1"),
    ],
)
def test_similarity_payloads_are_checked(payload: dict[str, object], where: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        SimilarityHandler().validate(payload)
    assert f"payload.{where}" in exc.value.message


def test_a_good_similarity_payload_is_kept() -> None:
    payload = {"pairs": [["a", "b"], ["c", "d"]], "labels": [1, 0.5]}
    assert SimilarityHandler().validate(payload) == {
        "pairs": [["a", "b"], ["c", "d"]], "labels": [1.0, 0.5]}


@pytest.mark.parametrize("blob", ["", "abc", "A" * 64, "g" * 64, 42])
def test_an_embed_payload_names_a_sha256(blob: object) -> None:
    with pytest.raises(InvalidRequest, match=r"payload\.blob"):
        DocumentEmbedHandler().validate({"blob": blob})
    assert DocumentEmbedHandler().validate({"blob": "a" * 64}) == {"blob": "a" * 64}
