"""From a document's bytes to the chunks that get embedded.

Text and markdown are decoded as UTF-8; a PDF's text comes from pypdf (of the ``models``
extra), page by page. Chunks follow paragraphs and stay under ``MAX_CHUNK_CHARS``: the model
reads at most 256 word pieces (about 1,000 characters of English) and drops the rest.
"""

from __future__ import annotations

import io
import re

from jobs.core import content_type

MAX_CHUNK_CHARS = 800
_PARAGRAPH = re.compile(r"\n\s*\n")


class UnreadableDocument(ValueError):
    """The bytes are not a document a handler reads (or a PDF that cannot be parsed)."""


def extract_text(data: bytes) -> tuple[str, str]:
    """``(content_type, text)`` of a document, its type told from the bytes."""
    kind = content_type.detect(data)
    if kind is None:
        raise UnreadableDocument("not a PDF, UTF-8 text or markdown document")
    if kind == content_type.PDF:
        return kind, _pdf_text(data)
    return kind, data.decode("utf-8").removeprefix("\ufeff")


def _pdf_text(data: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        text = "\n\n".join(page.extract_text() or "" for page in reader.pages)
        # A U+0000 pypdf keeps from a PDF's text is no content, and PostgreSQL cannot store
        # it in the chunks of the result.
        return text.replace("\x00", "")
    except (PdfReadError, ValueError, KeyError, TypeError) as exc:
        raise UnreadableDocument(f"the PDF cannot be read: {exc}") from None


def chunk_text(text: str, max_chars: int = MAX_CHUNK_CHARS) -> list[str]:
    """Paragraphs packed together up to ``max_chars``; a longer paragraph is cut at words
    (a single word longer than that, at ``max_chars``). No chunk is blank."""
    chunks: list[str] = []
    current = ""
    for paragraph in _PARAGRAPH.split(text):
        words = paragraph.split()
        for piece in _pieces(words, max_chars):
            if current and len(current) + 2 + len(piece) > max_chars:
                chunks.append(current)
                current = ""
            current = f"{current}\n\n{piece}" if current else piece
    if current:
        chunks.append(current)
    return chunks


def _pieces(words: list[str], max_chars: int) -> list[str]:
    pieces: list[str] = []
    line = ""
    for word in words:
        while len(word) > max_chars:
            if line:
                pieces.append(line)
                line = ""
            pieces.append(word[:max_chars])
            word = word[max_chars:]
        if not word:
            continue
        if line and len(line) + 1 + len(word) > max_chars:
            pieces.append(line)
            line = ""
        line = f"{line} {word}" if line else word
    if line:
        pieces.append(line)
    return pieces
