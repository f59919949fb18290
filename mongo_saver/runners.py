"""Run plans against a database: one runner for blocking clients, one for asyncio.

These two classes are the only code that differs between `MongoSaver` and
`AsyncMongoSaver`. The async runner accepts pymongo's `AsyncDatabase` and Motor's
`AsyncIOMotorDatabase`; where the two differ (Motor's `aggregate` returns a cursor, pymongo's
is a coroutine) it awaits whatever is awaitable.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

from pymongo import ReturnDocument
from pymongo.errors import BulkWriteError, DuplicateKeyError

from mongo_saver.ops import (
    Aggregate,
    BulkWrite,
    CreateIndexes,
    DeleteMany,
    Emit,
    Find,
    FindOneAndUpdate,
    ListIndexes,
    NextBatch,
    Op,
    OpenCursor,
    Plan,
    Sleep,
    UpdateOne_,
)

R = TypeVar("R")
_DUPLICATE_KEY = 11000
WHOLE_BATCH = 100_000
"""Batch size of queries read whole: one reply, up to the server's 16 MB batch limit."""


def _only_duplicates(error: BulkWriteError) -> bool:
    details = error.details or {}
    return not details.get("writeConcernErrors") and all(
        e.get("code") == _DUPLICATE_KEY for e in details.get("writeErrors", [])
    )


def _find_kwargs(query: Find) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"projection": query.projection, "limit": query.limit}
    if query.sort:
        kwargs["sort"] = list(query.sort)
    return kwargs


class SyncRunner:
    def __init__(self, database: Any) -> None:
        self.database = database

    def run(self, plan: Plan[R]) -> R:
        box: list[R] = []
        for _ in self.stream(plan, box):
            raise RuntimeError("a plan run with run() emitted a streamed item")
        return box[0]

    def stream(self, plan: Plan[R], box: list[R] | None = None) -> Iterator[Any]:
        cursors: list[Any] = []
        try:
            result: Any = None
            error: Exception | None = None
            while True:
                try:
                    op = plan.send(result) if error is None else plan.throw(error)
                except StopIteration as stop:
                    if box is not None:
                        box.append(stop.value)
                    return
                result, error = None, None
                if isinstance(op, Emit):
                    yield op.item
                    continue
                try:  # a failed operation is raised inside the plan, which may recover
                    result = self._execute(op, cursors)
                except Exception as exc:
                    error = exc
        finally:
            plan.close()
            for cursor in cursors:
                cursor.close()

    def _execute(self, op: Op, cursors: list[Any]) -> Any:
        db = self.database
        match op:
            case Find():
                return list(db[op.collection].find(op.filter, batch_size=WHOLE_BATCH,
                                                   **_find_kwargs(op)))
            case Aggregate():
                return list(db[op.collection].aggregate(list(op.pipeline),
                                                        batchSize=WHOLE_BATCH))
            case OpenCursor(query=Find() as q):
                cursor = db[q.collection].find(q.filter, batch_size=op.batch_size,
                                               **_find_kwargs(q))
                cursors.append(cursor)
                return cursor
            case OpenCursor(query=Aggregate() as q):
                cursor = db[q.collection].aggregate(list(q.pipeline), batchSize=op.batch_size)
                cursors.append(cursor)
                return cursor
            case NextBatch():
                return op.cursor.to_list(op.size)
            case BulkWrite():
                try:
                    db[op.collection].bulk_write(list(op.requests), ordered=op.ordered)
                except BulkWriteError as error:
                    if not (op.ignore_duplicates and _only_duplicates(error)):
                        raise
                return None
            case UpdateOne_():
                return db[op.collection].update_one(op.filter, op.update,
                                                    upsert=op.upsert).matched_count
            case FindOneAndUpdate():
                try:
                    return db[op.collection].find_one_and_update(
                        op.filter, op.update, upsert=op.upsert,
                        return_document=ReturnDocument.AFTER,
                    )
                except DuplicateKeyError:
                    if op.upsert:
                        return None
                    raise
            case Sleep():
                time.sleep(op.seconds)
                return None
            case DeleteMany():
                return db[op.collection].delete_many(op.filter).deleted_count
            case CreateIndexes():
                return db[op.collection].create_indexes(list(op.indexes))
            case ListIndexes():
                return list(db[op.collection].list_indexes())
        raise TypeError(f"unknown operation {op!r}")


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class AsyncRunner:
    def __init__(self, database: Any) -> None:
        self.database = database

    async def run(self, plan: Plan[R]) -> R:
        box: list[R] = []
        async for _ in self.stream(plan, box):
            raise RuntimeError("a plan run with run() emitted a streamed item")
        return box[0]

    async def stream(self, plan: Plan[R], box: list[R] | None = None) -> AsyncIterator[Any]:
        cursors: list[Any] = []
        try:
            result: Any = None
            error: Exception | None = None
            while True:
                try:
                    op = plan.send(result) if error is None else plan.throw(error)
                except StopIteration as stop:
                    if box is not None:
                        box.append(stop.value)
                    return
                result, error = None, None
                if isinstance(op, Emit):
                    yield op.item
                    continue
                try:  # a failed operation is raised inside the plan, which may recover
                    result = await self._execute(op, cursors)
                except Exception as exc:
                    error = exc
        finally:
            plan.close()
            for cursor in cursors:
                await _maybe_await(cursor.close())

    async def _execute(self, op: Op, cursors: list[Any]) -> Any:
        db = self.database
        match op:
            case Find():
                cursor = db[op.collection].find(op.filter, batch_size=WHOLE_BATCH,
                                                **_find_kwargs(op))
                return await cursor.to_list(None)
            case Aggregate():
                cursor = await _maybe_await(
                    db[op.collection].aggregate(list(op.pipeline), batchSize=WHOLE_BATCH)
                )
                return await cursor.to_list(None)
            case OpenCursor(query=Find() as q):
                cursor = db[q.collection].find(q.filter, batch_size=op.batch_size,
                                               **_find_kwargs(q))
                cursors.append(cursor)
                return cursor
            case OpenCursor(query=Aggregate() as q):
                cursor = await _maybe_await(
                    db[q.collection].aggregate(list(q.pipeline), batchSize=op.batch_size)
                )
                cursors.append(cursor)
                return cursor
            case NextBatch():
                return await op.cursor.to_list(op.size)
            case BulkWrite():
                try:
                    await db[op.collection].bulk_write(list(op.requests), ordered=op.ordered)
                except BulkWriteError as error:
                    if not (op.ignore_duplicates and _only_duplicates(error)):
                        raise
                return None
            case UpdateOne_():
                result = await db[op.collection].update_one(op.filter, op.update,
                                                            upsert=op.upsert)
                return result.matched_count
            case FindOneAndUpdate():
                try:
                    return await db[op.collection].find_one_and_update(
                        op.filter, op.update, upsert=op.upsert,
                        return_document=ReturnDocument.AFTER,
                    )
                except DuplicateKeyError:
                    if op.upsert:
                        return None
                    raise
            case Sleep():
                await asyncio.sleep(op.seconds)
                return None
            case DeleteMany():
                return (await db[op.collection].delete_many(op.filter)).deleted_count
            case CreateIndexes():
                return await db[op.collection].create_indexes(list(op.indexes))
            case ListIndexes():
                cursor = await _maybe_await(db[op.collection].list_indexes())
                return await cursor.to_list(None)
        raise TypeError(f"unknown operation {op!r}")
