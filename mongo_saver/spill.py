"""Payloads too large for one document, stored in chunks beside it.

MongoDB refuses documents over 16 MB, and an aggregation reply for one checkpoint
carries the entries it needs from other documents too. A payload (a channel value or
a pending write) larger than `spill_bytes` therefore goes to the chunks collection in
pieces of at most `CHUNK_BYTES`, and its place keeps `spill` (the number of chunks)
instead of `d`. Reads fetch the chunks of exactly the payloads they need, in one
query; puts write them before the document that refers to them, so a crash between
the two leaves unreferenced chunks (harmless: nothing reads them, and deleting the
thread removes them), never a reference to missing ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mongo_saver.errors import CorruptDocumentError, InvalidInputError
from mongo_saver.ops import Document, Find, Plan

CHUNK_BYTES = 4 * 1024 * 1024
CHUNK_IDENTITY = ("thread_id", "checkpoint_ns", "key", "n")
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""MongoDB's BSON document limit."""
DOCUMENT_BUDGET = 8 * 1024 * 1024
"""What a checkpoint keeps inline at most, so that a read bringing its entries together
with some from other documents usually fits one reply."""


def spill(
    payload: dict[str, Any], *, scope: Mapping[str, str], key: str, limit: int | None
) -> list[Document]:
    """Move `payload["d"]` into chunk documents if it is over `limit`; return the chunks."""
    data = payload.get("d")
    if limit is None or data is None or len(data) <= limit:
        return []
    pieces = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)]
    del payload["d"]
    payload["spill"] = len(pieces)
    payload["len"] = len(data)
    return [{**scope, "key": key, "n": n, "d": piece} for n, piece in enumerate(pieces)]


def spill_to_fit(
    entries: Iterable[dict[str, Any]],
    *,
    scope: Mapping[str, str],
    limit: int | None,
    size: int,
) -> list[Document]:
    """Spill entries over `limit`, then the largest others until the document, `size`
    bytes as built, keeps at most `DOCUMENT_BUDGET` inline; return the chunks."""
    if limit is None:
        return []
    entries = list(entries)
    chunks = []
    for entry in sorted(entries, key=lambda e: len(e.get("d", b"")), reverse=True):
        data = entry.get("d")
        if data is None:
            continue
        over_budget = size > DOCUMENT_BUDGET
        spilled = spill(entry, scope=scope, key=entry["k"], limit=0 if over_budget else limit)
        if not spilled:
            break  # sorted by size: nothing smaller is over the limit either
        chunks += spilled
        size -= len(data)
    return chunks


def write_key(doc: Mapping[str, Any]) -> str:
    """The chunk key of a pending write's payload."""
    return f"w:{doc['checkpoint_id']}:{doc['task_path']}:{doc['task_id']}:{doc['idx']}"


def check_size(size: int, what: str, largest: Iterable[tuple[int, str]]) -> None:
    """Refuse, before writing, a document MongoDB would refuse."""
    if size <= MAX_DOCUMENT_BYTES:
        return
    names = ", ".join(f"{name} ({n:,} B)" for n, name in sorted(largest, reverse=True)[:3])
    raise InvalidInputError(
        f"{what} would be {size:,} bytes, over MongoDB's 16 MB document limit "
        f"(largest: {names}); enable spilling (spill_bytes) to store it in chunks"
    )


def fill(
    chunks_collection: str,
    scope: Mapping[str, str],
    payloads: Iterable[tuple[str, dict[str, Any]]],
) -> Plan[None]:
    """Put back `d` into every `(key, payload)` that was spilled, in one query."""
    spilled = {key: p for key, p in payloads if "spill" in p and "d" not in p}
    if not spilled:
        return
    found = yield Find(
        chunks_collection,
        {**scope, "key": {"$in": sorted(spilled)}},
        projection={"_id": 0, "key": 1, "n": 1, "d": 1},
        sort=[("key", 1), ("n", 1)],
    )
    pieces: dict[str, list[bytes]] = {}
    for chunk in found:
        pieces.setdefault(chunk["key"], []).append(bytes(chunk["d"]))
    for key, payload in spilled.items():
        parts = pieces.get(key, [])
        data = b"".join(parts)
        if len(parts) != payload["spill"] or len(data) != payload.get("len", len(data)):
            raise CorruptDocumentError(
                f"spilled payload {key!r} of thread {scope.get('thread_id')!r}: "
                f"{len(parts)} of {payload['spill']} chunks found"
            )
        payload["d"] = data
