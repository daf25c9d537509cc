"""Text as PostgreSQL can store it: what a handler, a receiver or an exception says is kept
with a row (a progress message, a webhook try's error), and must never be why that row is
refused. PostgreSQL stores neither U+0000 (in text or JSON) nor a lone surrogate (not
UTF-8)."""

from __future__ import annotations


def storable_text(text: str, limit: int) -> str:
    """``text`` at most ``limit`` characters, a U+0000 written out (``\\x00``, as in a stored
    error) and a lone surrogate replaced (U+FFFD)."""
    text = text[:limit].replace("\x00", "\\x00")  # cut first: a long text costs nothing
    if not text.isascii():
        text = "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in text)
    return text[:limit]
