"""What a document is, told from its bytes, never from the client's word for it.

Pure: no I/O. A handler reads only the types named here; anything else is refused at upload
(415) rather than failing later on a worker that cannot read it.
"""

from __future__ import annotations

PDF = "application/pdf"
MARKDOWN = "text/markdown"
TEXT = "text/plain"
READABLE = (PDF, MARKDOWN, TEXT)

_PDF_MAGIC = b"%PDF-"
# Control characters other than tab, newline, form feed and carriage return: binary data.
_BINARY = frozenset(range(32)) - {9, 10, 12, 13}
_MARKDOWN_MARKS = ("# ", "## ", "### ", "```", "- ", "* ", "1. ", "> ")


def detect(data: bytes, filename: str | None = None) -> str | None:
    """The content type of ``data``, or None when no handler reads it.

    PDF by its magic number; UTF-8 text without control characters is text, and markdown when
    the name ends in ``.md``/``.markdown`` or a line starts like markdown does."""
    if data.startswith(_PDF_MAGIC):
        return PDF
    text = _as_text(data)
    if text is None:
        return None
    name = (filename or "").lower()
    if name.endswith((".md", ".markdown")) or _looks_like_markdown(text):
        return MARKDOWN
    return TEXT


def _as_text(data: bytes) -> str | None:
    if not data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(ord(ch) in _BINARY for ch in text):
        return None
    return text.removeprefix("\ufeff")


def _looks_like_markdown(text: str) -> bool:
    lines = [line.lstrip() for line in text.splitlines()[:200]]
    return sum(line.startswith(_MARKDOWN_MARKS) for line in lines) >= 2 or any(
        line.startswith(("# ", "```")) for line in lines[:5]
    )
