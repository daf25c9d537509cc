"""A batch's items as they are read: validated one by one (a bad one named by its index),
digested in order, kept compact until the batch is stored (``jobs.service.batches``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from typing import Any

from jobs.admission import submit as submission
from jobs.admission.submit import PayloadValidator
from jobs.core.errors import InvalidRequest, TierqError
from jobs.process.runtime import Runtime

MAX_BATCH_ITEMS = 100_000
# The longest ``custom_id`` an envelope may carry.
MAX_CUSTOM_ID = 200


class ValidatedItems:
    """A batch's items as they are read: each validated by the kind's handler as it comes (a
    bad one is an ``InvalidRequest`` naming its index), digested in order, and kept as its
    compact JSON, far smaller than the parsed value, until the batch is stored. Bounded by
    ``MAX_BATCH_ITEMS`` and, over HTTP, by the batch body limit."""

    def __init__(self, validator: PayloadValidator, kind: str, *, envelope: bool = False) -> None:
        self.kind = kind
        self.envelope = envelope
        self._validator = validator
        self._digest = _Digest(kind)
        self._payloads: list[bytes] = []
        self.custom_ids: list[str] = []
        self._seen_ids: set[str] = set()

    def __len__(self) -> int:
        return len(self._payloads)

    def add(self, item: Any) -> None:
        index = len(self._payloads)
        if self.envelope:
            custom_id, item = self._unwrap(index, item)
            self._digest.add_id(custom_id)
        payload = _validated(self._validator, self.kind, index, item)
        self._digest.add(index, payload)
        self._payloads.append(json.dumps(payload, separators=(",", ":")).encode())

    def _unwrap(self, index: int, item: Any) -> tuple[str, Any]:
        """An envelope's ``custom_id`` (1–200 characters, unique in the batch) and payload."""
        if not isinstance(item, dict) or set(item) != {"custom_id", "payload"}:
            raise _bad_item(index, [{"loc": [], "msg": 'an envelope is {"custom_id": "...", '
                                     '"payload": {...}} and nothing else'}])
        custom_id = item["custom_id"]
        if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID:
            raise _bad_item(index, [{"loc": ["custom_id"], "msg": "a string of 1 to "
                                     f"{MAX_CUSTOM_ID} characters"}])
        submission.check_text(custom_id, ("items", index, "custom_id"))
        if custom_id in self._seen_ids:
            raise _bad_item(index, [{"loc": ["custom_id"], "msg": f"{custom_id!r} is already "
                                     "the custom_id of another item of this batch"}])
        self._seen_ids.add(custom_id)
        self.custom_ids.append(custom_id)
        return custom_id, item["payload"]

    def extend(self, items: Iterable[Any]) -> None:
        for item in items:
            self.add(item)

    def timeout_s(self, runtime: Runtime, asked: float | None) -> float:
        """Each item's run-time limit (``jobs.admission.submit.timeout_of``)."""
        return submission.timeout_of(runtime, self._validator, self.kind, asked)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def chunks(self, size: int) -> Iterator[list[dict[str, Any]]]:
        """The validated payloads, parsed back ``size`` at a time."""
        for start in range(0, len(self._payloads), size):
            yield [json.loads(raw) for raw in self._payloads[start:start + size]]

    def check_complete(self) -> None:
        if not self._payloads:
            raise InvalidRequest("a batch needs at least one item",
                                 details=[{"loc": ["items"], "msg": "no items"}])


class _Digest:
    """sha256 of the kind and the validated items, in order; counts them too."""

    def __init__(self, kind: str) -> None:
        self._hash = hashlib.sha256(kind.encode())
        self.count = 0

    def add(self, index: int, payload: dict[str, Any]) -> None:
        self._hash.update(b"\n" + json.dumps(payload, sort_keys=True,
                                             separators=(",", ":")).encode())
        self.count = index + 1

    def add_id(self, custom_id: str) -> None:
        self._hash.update(b"\t" + custom_id.encode())

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _validated(validator: PayloadValidator, kind: str, index: int, item: Any
               ) -> dict[str, Any]:
    """The item validated by the kind's handler, its errors named by its index."""
    if index >= MAX_BATCH_ITEMS:
        raise InvalidRequest(f"a batch holds at most {MAX_BATCH_ITEMS} items; split it",
                             details=[{"loc": ["items", index], "msg": "too many items"}])
    if not isinstance(item, dict):
        raise _bad_item(index, [{"loc": ["payload"], "msg": "an item must be a JSON object"}])
    try:
        return validator.validate(kind, submission.check_json(item))
    except InvalidRequest as exc:
        if type(exc) is not InvalidRequest:  # an unknown kind: not the item's fault
            raise
        raise _bad_item(index, list(exc.details.get("details") or []), exc) from None


def _bad_item(index: int, details: list[Any], exc: TierqError | None = None) -> InvalidRequest:
    inner = exc.message if exc is not None else "an item must be a JSON object"
    located = [{**d, "loc": ["items", index, *d.get("loc", [])]} for d in details
               if isinstance(d, dict)]
    return InvalidRequest(f"items[{index}]: {inner}; nothing was stored", index=index,
                          details=located or [{"loc": ["items", index], "msg": inner}])
