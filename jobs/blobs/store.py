"""The blob store: documents by the sha256 of their bytes, shared by the API and workers.

Content addressing makes a write idempotent (the same file uploaded twice is stored once)
and lets a job carry just the digest. The store is a local directory by default (``blobs``
under the data directory) or any fsspec URL (``blob_url``: ``s3://bucket/tierq``,
``memory://``...), so API replicas and workers on other hosts read the same bytes.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fsspec

if TYPE_CHECKING:
    from jobs.process.settings import Settings

SHA256 = re.compile(r"^[0-9a-f]{64}$")
BLOBS_DIR = "blobs"


class BlobNotFound(LookupError):
    """No blob has this digest: it was never stored, or was pruned."""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_digest(text: str) -> bool:
    return bool(SHA256.match(text))


class BlobStore:
    """Put and get bytes by sha256. Local paths are written atomically (temp + rename)."""

    def __init__(self, url: str) -> None:
        self.url = url
        fs, root = fsspec.core.url_to_fs(url)
        self._fs: Any = fs
        self._root = str(root).rstrip("/")
        self._local = "file" in _protocols(fs)

    @classmethod
    def from_settings(cls, settings: Settings) -> BlobStore:
        return cls(store_url(settings))

    def path_of(self, sha256: str) -> str:
        if not is_digest(sha256):
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        return f"{self._root}/{sha256[:2]}/{sha256}"

    def put(self, data: bytes) -> str:
        """Store ``data``; its digest. Storing the same bytes again writes nothing."""
        sha256 = digest(data)
        path = self.path_of(sha256)
        if self._fs.exists(path):
            return sha256
        if self._local:
            _write_atomically(Path(path), data)
        else:
            self._fs.pipe_file(path, data)
        return sha256

    def get(self, sha256: str) -> bytes:
        path = self.path_of(sha256)
        try:
            data: bytes = self._fs.cat_file(path)
        except FileNotFoundError:
            raise BlobNotFound(f"no blob {sha256} in {self.url}") from None
        return data

    def exists(self, sha256: str) -> bool:
        return bool(self._fs.exists(self.path_of(sha256)))

    def delete(self, sha256: str) -> None:
        """Remove the blob (retention); a missing one is no error."""
        path = self.path_of(sha256)
        if self._fs.exists(path):
            self._fs.rm_file(path)


def store_url(settings: Settings) -> str:
    """The configured store, else ``blobs`` in the data directory."""
    return settings.blob_url or str(settings.home() / BLOBS_DIR)


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _write_atomically(path: Path, data: bytes) -> None:
    """A reader sees the whole blob or none: a crash mid-write leaves only a temp file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
