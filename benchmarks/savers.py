"""The savers under test, each on its own monitored client and its own fresh database."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import bson
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from pymongo import AsyncMongoClient, MongoClient

from benchmarks.monitor import CommandCounter

OURS_SYNC = "mongo_saver"
OURS_ASYNC = "mongo_saver_async"
OURS_MOTOR = "mongo_saver_motor"
INCUMBENT = "incumbent"
MEMORY = "in_memory"

LABELS = {
    OURS_SYNC: "MongoSaver (sync)",
    OURS_ASYNC: "AsyncMongoSaver (pymongo async)",
    OURS_MOTOR: "AsyncMongoSaver (Motor)",
    INCUMBENT: "MongoDBSaver 0.5.1 (incumbent)",
    MEMORY: "InMemorySaver",
}
COLORS = {
    OURS_SYNC: "#1f77b4",
    OURS_ASYNC: "#17becf",
    OURS_MOTOR: "#9edae5",
    INCUMBENT: "#d62728",
    MEMORY: "#7f7f7f",
}


@dataclass
class SaverHandle:
    """A saver plus what the benchmark needs around it."""

    kind: str
    saver: BaseCheckpointSaver[Any]
    counter: CommandCounter | None
    db_name: str | None
    is_async: bool
    _stats: Callable[[], dict[str, Any]]
    _close: list[Callable[[], Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return LABELS[self.kind]

    def bytes_stored(self) -> dict[str, Any]:
        """Bytes and document counts the saver holds, by collection (or structure)."""
        return self._stats()

    async def aclose(self) -> None:
        for close in self._close:
            result = close()
            if inspect.isawaitable(result):
                await result


def db_bytes_stored(stats_client: MongoClient[Any], db_name: str) -> dict[str, Any]:
    """Sum of the BSON sizes of every document in every collection of ``db_name``."""
    db = stats_client[db_name]
    out: dict[str, Any] = {"collections": {}, "total_bytes": 0, "total_docs": 0}
    for name in sorted(db.list_collection_names()):
        try:
            found = list(db[name].aggregate([
                {"$group": {"_id": None, "bytes": {"$sum": {"$bsonSize": "$$ROOT"}},
                            "docs": {"$sum": 1}}}
            ]))
            size, docs = (found[0]["bytes"], found[0]["docs"]) if found else (0, 0)
            method = "$bsonSize"
        except Exception:  # a server without $bsonSize: encode the documents here
            size = docs = 0
            for doc in db[name].find({}, batch_size=500):
                size += len(bson.encode(doc))
                docs += 1
            method = "client-side bson.encode"
        out["collections"][name] = {"bytes": size, "docs": docs}
        out["total_bytes"] += size
        out["total_docs"] += docs
        out["method"] = method
    return out


class MemorySizer:
    """Bytes an `InMemorySaver` holds: the serialized payloads in its three dicts.

    Counts the bytes and strings of each entry once, when first seen, so sizing after every
    turn costs only the new entries (plus a scan of the keys).
    """

    def __init__(self, saver: InMemorySaver) -> None:
        self.saver = saver
        self._seen: set[Any] = set()
        self.total = 0
        self.entries = 0

    @staticmethod
    def _size(value: Any) -> int:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return len(value)
        if isinstance(value, str):
            return len(value.encode())
        if isinstance(value, (tuple, list)):
            return sum(MemorySizer._size(v) for v in value)
        if isinstance(value, dict):
            return sum(MemorySizer._size(k) + MemorySizer._size(v) for k, v in value.items())
        return 8 if isinstance(value, (int, float)) else 0

    def refresh(self) -> int:
        s = self.saver
        for thread_id, namespaces in s.storage.items():
            for ns, checkpoints in namespaces.items():
                for checkpoint_id, entry in checkpoints.items():
                    key = ("c", thread_id, ns, checkpoint_id)
                    if key not in self._seen:
                        self._seen.add(key)
                        self.total += self._size(key[1:]) + self._size(entry)
                        self.entries += 1
        for wkey, writes in s.writes.items():
            for inner, entry in writes.items():
                key = ("w", wkey, inner)
                if key not in self._seen:
                    self._seen.add(key)
                    self.total += self._size(wkey) + self._size(inner) + self._size(entry)
                    self.entries += 1
        for bkey, entry in s.blobs.items():
            key = ("b", bkey)
            if key not in self._seen:
                self._seen.add(key)
                self.total += self._size(bkey) + self._size(entry)
                self.entries += 1
        return self.total

    def stats(self) -> dict[str, Any]:
        total = self.refresh()
        return {"total_bytes": total, "total_docs": self.entries,
                "method": "sum of serialized payload bytes in storage/writes/blobs"}


def _db_name(scenario: str, kind: str) -> str:
    return f"bench_{scenario}_{kind}_{uuid.uuid4().hex[:8]}"[:60]


def make_saver(kind: str, uri: str | None, scenario: str,
               stats_client: MongoClient[Any] | None) -> SaverHandle:
    """A sync-constructible saver (all but the async ones); see :func:`amake_saver`."""
    if kind == MEMORY:
        memory = InMemorySaver()
        sizer = MemorySizer(memory)
        handle = SaverHandle(kind, memory, None, None, False, sizer.stats)
        handle.sizer = sizer  # type: ignore[attr-defined]
        return handle
    assert uri is not None and stats_client is not None
    counter = CommandCounter()
    db_name = _db_name(scenario, kind)
    client: MongoClient[Any] = MongoClient(uri, event_listeners=[counter])
    if kind == OURS_SYNC:
        from mongo_saver import MongoSaver

        saver: BaseCheckpointSaver[Any] = MongoSaver(client, db_name=db_name)
        saver.setup()  # type: ignore[attr-defined]
    elif kind == INCUMBENT:
        from langgraph.checkpoint.mongodb import MongoDBSaver

        saver = MongoDBSaver(client, db_name=db_name)  # creates its indexes here
    else:
        raise ValueError(f"{kind} is not a sync saver")
    return SaverHandle(kind, saver, counter, db_name, False,
                       lambda: db_bytes_stored(stats_client, db_name), [client.close])


async def amake_saver(kind: str, uri: str | None, scenario: str,
                      stats_client: MongoClient[Any] | None) -> SaverHandle:
    """Any saver, for use from a running event loop (async ones get async clients)."""
    if kind not in (OURS_ASYNC, OURS_MOTOR):
        return make_saver(kind, uri, scenario, stats_client)
    from mongo_saver import AsyncMongoSaver

    assert uri is not None and stats_client is not None
    counter = CommandCounter()
    db_name = _db_name(scenario, kind)
    client: Any
    if kind == OURS_ASYNC:
        client = AsyncMongoClient(uri, event_listeners=[counter])
    else:
        from motor.motor_asyncio import AsyncIOMotorClient

        client = AsyncIOMotorClient(uri, event_listeners=[counter])
    saver = AsyncMongoSaver(client, db_name=db_name)
    await saver.setup()
    return SaverHandle(kind, saver, counter, db_name, True,
                       lambda: db_bytes_stored(stats_client, db_name), [client.close])


def motor_available() -> bool:
    try:
        import motor.motor_asyncio  # noqa: F401
    except ImportError:
        return False
    return True


def run_sync(coro: Any) -> Any:
    return asyncio.run(coro)
