"""The database operations a saver plan can ask for.

Saver logic is written once, as generators ("plans") that yield these operations and
receive their results. `MongoSaver` runs a plan with pymongo's blocking client and
`AsyncMongoSaver` with an asyncio client; neither contains saver logic of its own.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pymongo import IndexModel
from pymongo.operations import DeleteMany as DeleteManyModel
from pymongo.operations import InsertOne, ReplaceOne, UpdateOne

Document = dict[str, Any]
WriteModel = InsertOne[Document] | ReplaceOne[Document] | UpdateOne | DeleteManyModel


@dataclass(frozen=True, slots=True)
class Find:
    """`find`, fully read; only for queries whose size is bounded."""

    collection: str
    filter: Mapping[str, Any]
    projection: Mapping[str, Any] | None = None
    sort: Sequence[tuple[str, int]] | None = None
    limit: int = 0


@dataclass(frozen=True, slots=True)
class Aggregate:
    """`aggregate`, fully read; only for pipelines whose output is bounded."""

    collection: str
    pipeline: Sequence[Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class OpenCursor:
    """Start a streamed query; the result is an opaque cursor for `NextBatch`.

    The runner closes every cursor a plan opened when the plan ends or is abandoned.
    """

    query: Find | Aggregate
    batch_size: int


@dataclass(frozen=True, slots=True)
class NextBatch:
    """Up to `size` more documents from a cursor; an empty list when it is exhausted."""

    cursor: Any
    size: int


@dataclass(frozen=True, slots=True)
class BulkWrite:
    """One `bulk_write` round trip; result is None.

    With `ignore_duplicates`, duplicate-key errors (another writer's identical upsert
    won the race) are expected and dropped; any other error is raised.
    """

    collection: str
    requests: Sequence[WriteModel]
    ordered: bool = False
    ignore_duplicates: bool = False


@dataclass(frozen=True, slots=True)
class UpdateOne_:
    """`update_one`; the result is the number of matched documents."""

    collection: str
    filter: Mapping[str, Any]
    update: Mapping[str, Any] | Sequence[Mapping[str, Any]]
    upsert: bool = False


@dataclass(frozen=True, slots=True)
class FindOneAndUpdate:
    """`find_one_and_update` returning the document after the update, or None.

    With `upsert`, a duplicate-key error means the filter matched nothing while a
    document with the same `_id` exists (a held lease): the result is None then too.
    """

    collection: str
    filter: Mapping[str, Any]
    update: Mapping[str, Any] | Sequence[Mapping[str, Any]]
    upsert: bool = False


@dataclass(frozen=True, slots=True)
class Sleep:
    """Not I/O: wait `seconds` (`time.sleep` or `asyncio.sleep`, as the runner is)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class DeleteMany:
    """`delete_many`; the result is the number of deleted documents."""

    collection: str
    filter: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class CreateIndexes:
    collection: str
    indexes: Sequence[IndexModel] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ListIndexes:
    """The collection's index descriptions (`list_indexes`), as a list."""

    collection: str


@dataclass(frozen=True, slots=True)
class Emit:
    """Not I/O: hand one item of a streamed result to the caller."""

    item: Any


Op = (
    Find | Aggregate | OpenCursor | NextBatch | BulkWrite | UpdateOne_ | FindOneAndUpdate
    | DeleteMany | CreateIndexes | ListIndexes | Sleep | Emit
)
R = TypeVar("R")
Plan = Generator[Op, Any, R]
