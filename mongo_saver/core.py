"""The saver's logic, once, as plans of database operations (see `mongo_saver.ops`).

`SaverCore` holds configuration and the value cache; each public method returns a plan
that `MongoSaver` or `AsyncMongoSaver` runs. Every query on the hot path (put, put_writes,
get_tuple, list with a config, delta history) is targeted by `thread_id`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import bson
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.errors import OperationFailure
from pymongo.operations import ReplaceOne, UpdateOne

from mongo_saver import documents as docs_
from mongo_saver.documents import require_id
from mongo_saver.errors import (
    CorruptDocumentError,
    InvalidInputError,
    MigrationError,
    MongoSaverError,
)
from mongo_saver.history import AncestorWalk, delta_starts, own_seeds
from mongo_saver.legacy import convert_write, is_legacy, is_legacy_write, legacy_filter_value
from mongo_saver.migrations import MigrationContext, SchemaMigrations
from mongo_saver.ops import (
    Aggregate,
    BulkWrite,
    CreateIndexes,
    DeleteMany,
    Document,
    Emit,
    Find,
    ListIndexes,
    NextBatch,
    OpenCursor,
    Plan,
    UpdateOne_,
)
from mongo_saver.removal import DELTA_COUNTERS, RemovalPlan, plan_removal
from mongo_saver.spill import CHUNK_IDENTITY, check_size, fill, spill, spill_to_fit
from mongo_saver.spill import write_key as spill_write_key
from mongo_saver.upgrade import DocumentUpgrader
from mongo_saver.values import (
    ChannelState,
    MissingBlobs,
    StateCache,
    StoredChannel,
    known_values,
    plan_values,
    resolve_values,
)

logger = logging.getLogger("mongo_saver")

STREAM_BATCH = 500
_MAX_RESOLVE_ROUNDS = 4
_IN_CHUNK = 400  # keep `$in` lists small enough for every server we test on


@dataclass(frozen=True, slots=True)
class Target:
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str | None


def target_of(config: RunnableConfig | None) -> Target:
    """Validate the `configurable` part of a config before any I/O."""
    configurable = (config or {}).get("configurable") or {}
    if "thread_id" not in configurable:
        raise InvalidInputError(
            "config['configurable']['thread_id'] is required by the MongoDB checkpointer"
        )
    thread_id = require_id("thread_id", configurable["thread_id"])
    checkpoint_ns = require_id(
        "checkpoint_ns", configurable.get("checkpoint_ns", ""), allow_empty=True
    )
    checkpoint_id = configurable.get("checkpoint_id")
    if checkpoint_id is not None:
        require_id("checkpoint_id", checkpoint_id)
    return Target(thread_id, checkpoint_ns, checkpoint_id)


def next_version(current: str | int | float | None) -> str | int:
    """A version that sorts after `current` and never collides with a racing run's.

    Threads started by a saver with integer versions (langgraph-checkpoint-mongodb, for
    one) keep integers, because LangGraph compares a thread's versions with each other.
    """
    if isinstance(current, (int, float)):
        return int(current) + 1
    number = 0 if current is None else int(current.split(".")[0])
    # Fixed width keeps string order equal to numeric order; the random part (1 in 10^10
    # to collide) keeps two runs racing from the same checkpoint apart.
    return f"{number + 1:016}.{random.randrange(10**10):010}"


def _chunks(items: Sequence[Any], size: int = _IN_CHUNK) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)] or [[]]


def holder_entries(found: Mapping[str, Any]) -> list[Document]:
    """Value entries of an aggregated document: its `own` and those of `blob_docs`."""
    return [*(found.get("own") or ()),
            *(e for holder in found.get("blob_docs", ()) for e in holder["values"] or ())]


SKELETON = {"_id": 0, "checkpoint_id": 1, "parent_checkpoint_id": 1, "schema_version": 1,
            "checkpoint.channel_versions": 1, "values.k": 1, "values.kind": 1,
            "heads": 1, "empty": 1}
"""The fields a walk along the parent chain reads."""


_TOO_LARGE_CODES = frozenset({10334, 17419, 4568})


def reply_too_large(error: OperationFailure) -> bool:
    """Whether the server refused a reply document over its 16 MB limit."""
    text = str(error).lower()
    return error.code in _TOO_LARGE_CODES and ("size" in text or "large" in text)


class SaverCore:
    """Configuration, cache and plans shared by the sync and async savers."""

    def __init__(
        self,
        serde: SerializerProtocol,
        *,
        checkpoint_collection: str,
        writes_collection: str,
        migrations: SchemaMigrations | None,
        write_back: bool,
        merge_every: int,
        cache_size: int,
        size_warning_bytes: int,
        spill_bytes: int | None,
    ) -> None:
        self.serde = serde
        self.checkpoints = checkpoint_collection
        self.writes = writes_collection
        self.chunks = f"{checkpoint_collection}_chunks"
        self.spill_bytes = spill_bytes
        self.upgrader = DocumentUpgrader(
            serde,
            checkpoints=checkpoint_collection,
            writes=writes_collection,
            migrations=migrations,
            write_back=write_back,
        )
        self.merge_every = merge_every
        self.cache = StateCache(cache_size)
        self.size_warning_bytes = size_warning_bytes

    # --- setup ---------------------------------------------------------------------------

    def setup(self) -> Plan[None]:
        """Create every index; idempotent, and safe when many processes run it at once.

        Refuses to go on over a TTL index (langgraph-checkpoint-mongodb creates one with its
        `ttl` option): it would delete single checkpoints and break the threads around them.
        """
        for collection in (self.checkpoints, self.writes):
            for index in (yield ListIndexes(collection)):
                if "expireAfterSeconds" in index:
                    raise MongoSaverError(
                        f"collection {collection!r} has a TTL index {index['name']!r}, which "
                        "deletes checkpoints one by one and breaks the threads they belong to; "
                        f"drop it (db.{collection}.dropIndex({index['name']!r})) and expire "
                        "whole idle threads with `mongo-saver expire` instead"
                    )
        yield CreateIndexes(
            self.checkpoints,
            [
                # Default names: the same unique index that langgraph-checkpoint-mongodb
                # creates is then recognised as already present.
                IndexModel(
                    [("thread_id", ASCENDING), ("checkpoint_ns", ASCENDING),
                     ("checkpoint_id", DESCENDING)],
                    unique=True,
                ),
                IndexModel([("values.k", ASCENDING)]),
                IndexModel([("metadata.run_id", ASCENDING)], sparse=True),
                IndexModel([("schema_version", ASCENDING)]),
            ],
        )
        yield CreateIndexes(
            self.chunks,
            [IndexModel([(f, ASCENDING) for f in CHUNK_IDENTITY], unique=True)],
        )
        yield CreateIndexes(
            self.writes,
            [
                IndexModel([(f, ASCENDING) for f in docs_.WRITE_IDENTITY], unique=True)
            ],
        )

    # --- writing -------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Plan[RunnableConfig]:
        target = target_of(config)
        checkpoint_id = require_id("checkpoint id", checkpoint.get("id"))
        parent_state = (
            self.cache.get((target.thread_id, target.checkpoint_ns, target.checkpoint_id))
            if target.checkpoint_id
            else None
        )
        planned = plan_values(
            self.serde,
            thread_id=target.thread_id,
            channel_values=checkpoint.get("channel_values", {}),
            channel_versions=checkpoint["channel_versions"],
            new_versions=new_versions,
            parent=parent_state,
            merge_every=self.merge_every,
            schema_version=self.upgrader.current_schema_version,
        )
        identity = {
            "thread_id": target.thread_id,
            "checkpoint_ns": target.checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
        doc: Document = {
            **identity,
            "parent_checkpoint_id": target.checkpoint_id,
            "format": docs_.FORMAT_VERSION,
            "schema_version": self.upgrader.current_schema_version,
            "created_at": docs_.utcnow(),
            "checkpoint": docs_.checkpoint_header(self.serde, checkpoint),
            "metadata": docs_.metadata_to_bson(
                self.serde, get_serializable_checkpoint_metadata(config, metadata)
            ),
            "values": planned.entries,
            "blob_keys": planned.blob_keys,
        }
        if planned.heads:
            doc["heads"] = docs_.escape_keys(planned.heads, "channel")
        if planned.empty:
            doc["empty"] = planned.empty
        # Delta channels: the ones LangGraph counts now, and the ones the parent tracked
        # (LangGraph leaves a channel out of its counters on some checkpoints).
        parent_seeds = self.cache.seeds(
            (target.thread_id, target.checkpoint_ns, target.checkpoint_id or ""))
        counters = cast(Mapping[str, Any], dict(metadata or {}).get(DELTA_COUNTERS) or {})
        delta_channels = sorted({str(ch) for ch in counters} | set(parent_seeds or ()))
        starts = delta_starts(delta_channels, target.checkpoint_id, parent_state,
                              parent_seeds) if delta_channels else None
        if starts:
            doc["delta_from"] = min(starts.values())
            doc["delta"] = [{"c": ch, "from": start} for ch, start in starts.items()]
        scope = {"thread_id": target.thread_id, "checkpoint_ns": target.checkpoint_ns}
        inline = len(bson.encode(doc))
        chunks = spill_to_fit(planned.entries, scope=scope, limit=self.spill_bytes, size=inline)
        if chunks:  # encode again only when spilling changed the document
            inline = len(bson.encode(doc))
        check_size(inline, f"checkpoint {checkpoint_id} of thread {target.thread_id!r}",
                   ((len(e.get("d", b"")), e["c"]) for e in planned.entries))
        doc["size"] = inline + sum(len(c["d"]) for c in chunks)
        self._warn_if_large(doc)
        if chunks:
            yield from self._store_chunks(chunks, checkpoint_id)
        yield BulkWrite(self.checkpoints, [ReplaceOne(identity, doc, upsert=True)])
        key = (target.thread_id, target.checkpoint_ns, checkpoint_id)
        self.cache.put(key, planned.state)
        if starts:
            self.cache.put_seeds(key, own_seeds(checkpoint_id, starts, planned.state))
        return {
            "configurable": {
                "thread_id": target.thread_id,
                "checkpoint_ns": target.checkpoint_ns,
                "checkpoint_id": checkpoint_id,
            }
        }

    def _store_chunks(self, chunks: list[Document], checkpoint_id: str) -> Plan[None]:
        """Write spilled chunks (idempotently) before the document that refers to them."""
        requests = []
        for chunk in chunks:
            chunk["checkpoint_id"] = checkpoint_id
            key = {f: chunk[f] for f in CHUNK_IDENTITY}
            requests.append(ReplaceOne(key, chunk, upsert=True))
        yield BulkWrite(self.chunks, requests)

    def _warn_if_large(self, doc: Document) -> None:
        if doc["size"] < self.size_warning_bytes:
            return
        largest = sorted(
            ((e.get("len") or len(e.get("d", b"")), e["c"]) for e in doc["values"]), reverse=True
        )[:3]
        logger.warning(
            "checkpoint %s of thread %r stores %d bytes (threshold %d); largest channels: %s",
            doc["checkpoint_id"],
            doc["thread_id"],
            doc["size"],
            self.size_warning_bytes,
            ", ".join(f"{name} ({size} B)" for size, name in largest),
        )

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> Plan[None]:
        target = target_of(config)
        if target.checkpoint_id is None:
            raise InvalidInputError("put_writes needs config['configurable']['checkpoint_id']")
        documents = docs_.write_documents(
            self.serde,
            thread_id=target.thread_id,
            checkpoint_ns=target.checkpoint_ns,
            checkpoint_id=target.checkpoint_id,
            task_id=task_id,
            task_path=task_path,
            writes=writes,
            schema_version=self.upgrader.current_schema_version,
        )
        if not documents:
            return
        scope = {"thread_id": target.thread_id, "checkpoint_ns": target.checkpoint_ns}
        chunks = []
        for doc in documents:
            chunks += spill(doc["value"], scope=scope, key=spill_write_key(doc),
                            limit=self.spill_bytes)
            check_size(len(bson.encode(doc)), f"a write to {doc['channel']!r} of thread "
                       f"{target.thread_id!r}", [(len(doc["value"].get("d", b"")), doc["channel"])])
        if chunks:
            yield from self._store_chunks(chunks, target.checkpoint_id)
        requests = []
        for doc in documents:
            identity = {f: doc[f] for f in docs_.WRITE_IDENTITY}
            # Special channels overwrite their slot; ordinary writes keep the first value.
            update = {"$set": doc} if doc["idx"] < 0 else {"$setOnInsert": doc}
            requests.append(UpdateOne(identity, update, upsert=True))
        yield BulkWrite(self.writes, requests, ignore_duplicates=True)

    # --- reading -------------------------------------------------------------------------

    def _blob_lookup(self, skip: Sequence[str] = ()) -> Document:
        """`$lookup` stage fetching, per checkpoint, the value entries its state needs,
        except `skip`: keys whose values this process already holds decoded."""
        wanted: Document = {"$in": ["$$this.k", "$$keys"]}
        if skip:
            held = {"$indexOfArray": [{"$literal": list(skip)}, "$$this.k"]}
            wanted = {"$and": [wanted, {"$lt": [held, 0]}]}
        return {
            "$lookup": {
                "from": self.checkpoints,
                "localField": "blob_keys",
                "foreignField": "values.k",
                "let": {"t": "$thread_id", "ns": "$checkpoint_ns", "keys": "$blob_keys"},
                "pipeline": [
                    {"$match": {"$expr": {"$and": [
                        {"$eq": ["$thread_id", "$$t"]},
                        {"$eq": ["$checkpoint_ns", "$$ns"]},
                    ]}}},
                    # Newest last, so that if a version was stored twice the latest wins.
                    {"$sort": {"checkpoint_id": 1}},
                    {"$project": {"_id": 0, "values": {"$filter": {
                        "input": {"$ifNull": ["$values", []]}, "cond": wanted,
                    }}}},
                ],
                "as": "blob_docs",
            }
        }

    def _holders_pipeline(
        self, scope: Mapping[str, str], keys: list[str], skip: Sequence[str] = ()
    ) -> list[Document]:
        """The documents holding `keys`: those entries (as `own`) and, in `blob_docs`,
        the entries their append chains reach back to (named by the holder's own
        `blob_keys`; the `$lookup` runs on that stored field, as every server supports)."""
        return [
            {"$match": {**scope, "values.k": {"$in": keys}}},
            self._blob_lookup(skip),
            {"$project": {"blob_docs": 1, "own": {"$filter": {
                "input": "$values", "cond": {"$in": ["$$this.k", {"$literal": keys}]},
            }}}},
        ]

    def _writes_lookup(self) -> Document:
        return {
            "$lookup": {
                "from": self.writes,
                "localField": "checkpoint_id",
                "foreignField": "checkpoint_id",
                "let": {"t": "$thread_id", "ns": "$checkpoint_ns"},
                "pipeline": [
                    {"$match": {"$expr": {"$and": [
                        {"$eq": ["$thread_id", "$$t"]},
                        {"$eq": ["$checkpoint_ns", "$$ns"]},
                    ]}}},
                    {"$sort": {"task_path": 1, "task_id": 1, "idx": 1}},
                    {"$project": {"checkpoint_id": 1, "task_id": 1, "channel": 1, "value": 1,
                                  "type": 1,
                                  "task_path": 1, "idx": 1, "batch": 1, "of": 1, "format": 1,
                                  "schema_version": 1}},
                ],
                "as": "pending",
            }
        }

    def read_pipeline(
        self,
        match: Mapping[str, Any],
        limit: int | None,
        skip: Sequence[str] = (),
        prefetch_delta: bool = False,
    ) -> list[Document]:
        """One aggregation returning checkpoints newest first, with values and writes.

        With `prefetch_delta`, a checkpoint that records where its `DeltaChannel`
        history starts also brings the skeletons and writes from there, so the history
        call LangGraph makes right after needs no query of its own.
        """
        pipeline: list[Document] = [{"$match": dict(match)}, {"$sort": {"checkpoint_id": -1}}]
        if limit is not None:
            pipeline.append({"$limit": limit})
        pipeline += [self._blob_lookup(skip), self._writes_lookup()]
        if prefetch_delta:
            pipeline += [self._range_lookup(self.checkpoints, SKELETON, "delta_path"),
                         self._range_lookup(self.writes, None, "delta_writes")]
        return pipeline

    def _range_lookup(
        self, collection: str, projection: Mapping[str, Any] | None, into: str
    ) -> Document:
        """Documents of the same namespace from `delta_from` up to (not including) this one."""
        stages: list[Document] = [{"$match": {"$expr": {"$and": [
            {"$eq": ["$thread_id", "$$t"]},
            {"$eq": ["$checkpoint_ns", "$$ns"]},
            {"$gte": ["$checkpoint_id", "$$lo"]},
            {"$lt": ["$checkpoint_id", "$$hi"]},
        ]}}}]
        if collection == self.writes:  # every channel: the walk keeps the ones it needs
            stages.append({"$sort": {"checkpoint_id": 1, "task_path": 1, "task_id": 1, "idx": 1}})
        if projection is not None:
            stages.append({"$project": dict(projection)})
        return {"$lookup": {
            "from": collection,
            "let": {"t": "$thread_id", "ns": "$checkpoint_ns", "hi": "$checkpoint_id",
                    "lo": {"$ifNull": ["$delta_from", "$checkpoint_id"]}},
            "pipeline": stages,
            "as": into,
        }}

    def _known(self, match: Mapping[str, Any]) -> tuple[dict[str, StoredChannel], list[str]]:
        """Values already held for the one thread namespace a read targets, if any."""
        thread_id, checkpoint_ns = match.get("thread_id"), match.get("checkpoint_ns")
        if not isinstance(thread_id, str) or not isinstance(checkpoint_ns, str):
            return {}, []
        return known_values(self.cache.latest(thread_id, checkpoint_ns))

    def get_tuple(self, config: RunnableConfig) -> Plan[CheckpointTuple | None]:
        target = target_of(config)
        match: Document = {"thread_id": target.thread_id, "checkpoint_ns": target.checkpoint_ns}
        if target.checkpoint_id is not None:
            match["checkpoint_id"] = target.checkpoint_id
        known, skip = self._known(match)
        # Only threads known to use DeltaChannels pay for fetching their history ahead.
        prefetch = self.cache.has_delta_channels(target.thread_id, target.checkpoint_ns)
        pipeline = self.read_pipeline(match, 1, skip, prefetch_delta=prefetch)
        try:
            found = yield Aggregate(self.checkpoints, pipeline)
        except OperationFailure as error:
            if not reply_too_large(error):
                raise
            found = yield from self.read_in_parts(match, 1, skip)
        if not found:
            return None
        return (yield from self.tuple_from_document(found[0], known))

    def read_in_parts(
        self, match: Mapping[str, Any], limit: int, skip: Sequence[str] = ()
    ) -> Plan[list[Document]]:
        """What `read_pipeline` returns, assembled from queries whose replies stay small.

        The fallback for a checkpoint whose values from other documents add up past
        MongoDB's 16 MB reply-document limit: the checkpoints themselves, then the value
        entries they need one entry per result document, then their writes.
        """
        found = yield Find(self.checkpoints, match, sort=[("checkpoint_id", DESCENDING)],
                           limit=limit)
        for doc in found:
            scope = {"thread_id": doc["thread_id"], "checkpoint_ns": doc["checkpoint_ns"]}
            keys = sorted(set(doc.get("blob_keys") or ()) - set(skip))
            entries: list[Document] = []
            if keys:
                cursor = yield OpenCursor(Aggregate(self.checkpoints, [
                    {"$match": {**scope, "values.k": {"$in": keys}}},
                    {"$unwind": "$values"},
                    {"$match": {"values.k": {"$in": keys}}},
                    {"$replaceRoot": {"newRoot": "$values"}},
                ]), STREAM_BATCH)
                while batch := (yield NextBatch(cursor, STREAM_BATCH)):
                    entries += batch
            doc["blob_docs"] = [{"values": entries}]
            doc["pending"] = yield Find(
                self.writes, {**scope, "checkpoint_id": doc["checkpoint_id"]},
                sort=[("task_path", ASCENDING), ("task_id", ASCENDING), ("idx", ASCENDING)],
            )
        return list(found)

    def list_checkpoints(
        self,
        config: RunnableConfig | None,
        *,
        filter: Mapping[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Plan[None]:
        match: Document = {}
        if config is not None:
            configurable = config.get("configurable") or {}
            if "thread_id" in configurable:
                target = target_of(config)
                match["thread_id"] = target.thread_id
                if "checkpoint_ns" in configurable:
                    match["checkpoint_ns"] = target.checkpoint_ns
                if target.checkpoint_id is not None:
                    match["checkpoint_id"] = target.checkpoint_id
        if before is not None:
            before_id = get_checkpoint_id(before)
            if before_id is not None:
                bound = {"$lt": require_id("before checkpoint_id", before_id)}
                match["checkpoint_id"] = (
                    {"$eq": match["checkpoint_id"], **bound}
                    if "checkpoint_id" in match
                    else bound
                )
        if filter:
            match.update(docs_.metadata_filter(
                self.serde, filter, lambda value: [legacy_filter_value(self.serde, value)]
            ))
        if limit is not None:
            if not isinstance(limit, int) or isinstance(limit, bool):
                raise InvalidInputError(f"limit must be an int, got {limit!r}")
            if limit <= 0:
                return
        # One more than the limit lets the server close the cursor in its first reply.
        batch = min(limit + 1, STREAM_BATCH) if limit else STREAM_BATCH
        known, skip = self._known(match)
        pipeline = self.read_pipeline(match, limit, skip)
        emitted, last = 0, None
        try:
            cursor = yield OpenCursor(Aggregate(self.checkpoints, pipeline), batch)
            while found := (yield NextBatch(cursor, batch)):
                for doc in found:
                    yield Emit((yield from self.tuple_from_document(doc, known)))
                    emitted, last = emitted + 1, doc["checkpoint_id"]
        except OperationFailure as error:
            if not reply_too_large(error):
                raise
            # Go on one checkpoint at a time from where the stream stopped.
            while limit is None or emitted < limit:
                rest = match if last is None else {
                    "$and": [match, {"checkpoint_id": {"$lt": last}}]}
                found = yield from self.read_in_parts(rest, 1, skip)
                if not found:
                    return
                yield Emit((yield from self.tuple_from_document(found[0], known)))
                emitted, last = emitted + 1, found[0]["checkpoint_id"]

    def tuple_from_document(
        self, stored: Document, known: Mapping[str, StoredChannel] | None = None
    ) -> Plan[CheckpointTuple]:
        """Decode one aggregated checkpoint; upgrade (and write back) an old one."""
        stored = {**stored, "pending": docs_.complete_writes(stored.get("pending") or [])}
        up = self.upgrader
        doc, was_legacy = up.normalize(stored)
        entries = {e["k"]: e for e in holder_entries(doc)}
        entries.update((e["k"], e) for e in doc.get("values", []))
        scope = {"thread_id": doc["thread_id"], "checkpoint_ns": doc["checkpoint_ns"]}
        yield from fill(self.chunks, scope, [
            *entries.items(),
            *((spill_write_key(w), w["value"]) for w in doc.get("pending", [])
              if isinstance(w.get("value"), dict)),
        ])
        version = doc["schema_version"]
        ctx = MigrationContext(doc["thread_id"], doc["checkpoint_id"])
        current = version == up.current_schema_version
        values, state = yield from self._resolve(doc, entries, version, ctx,
                                                 known if current else None)
        thread_id, checkpoint_ns = doc["thread_id"], doc["checkpoint_ns"]
        checkpoint_id = doc["checkpoint_id"]
        checkpoint = docs_.checkpoint_from_header(
            self.serde, doc["checkpoint"], checkpoint_id, values
        )
        upgraded_now = was_legacy or up.needs_upgrade(stored)
        if upgraded_now:
            upgraded = up.upgrade(doc, checkpoint, state, was_legacy, stored.get("_id"))
            yield from upgraded.write_back
            checkpoint, pending = upgraded.checkpoint, upgraded.pending_writes
            state = upgraded.state
        else:
            pending = [docs_.write_from_document(self.serde, w) for w in doc.get("pending", [])]
        key = (thread_id, checkpoint_ns, checkpoint_id)
        parent_id = doc.get("parent_checkpoint_id")
        if upgraded_now:
            self.cache.put(key, state)
        else:
            self.cache.remember(key, state)
            self._remember_delta(key, doc, parent_id, state)
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
                                     "checkpoint_id": checkpoint_id}},
            checkpoint=checkpoint,
            metadata=docs_.metadata_from_bson(self.serde, doc.get("metadata", {})),
            parent_config=(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
                                  "checkpoint_id": parent_id}}
                if parent_id
                else None
            ),
            pending_writes=pending,
        )

    def _remember_delta(
        self, key: tuple[str, str, str], doc: Document, parent_id: str | None,
        state: ChannelState,
    ) -> None:
        """Keep a read checkpoint's delta bookkeeping and the history fetched with it."""
        starts = {d["c"]: d["from"] for d in doc.get("delta") or ()}
        if not starts:
            return
        if self.cache.seeds(key) is None:
            self.cache.put_seeds(key, own_seeds(key[2], starts, state))
        if "delta_path" in doc:
            self.cache.prefetch(key, (parent_id, doc["delta_path"], doc["delta_writes"]))

    def _resolve(
        self,
        doc: Document,
        entries: dict[str, Document],
        schema_version: int,
        ctx: MigrationContext,
        known: Mapping[str, StoredChannel] | None = None,
    ) -> Plan[tuple[dict[str, Any], ChannelState]]:
        """Rebuild channel values, fetching chains this document could not name itself."""
        versions = docs_.channel_versions_of(doc)
        heads = self.upgrader.stored_heads(doc)
        lift = self.upgrader.lift(ctx)
        absent: set[str] = set()
        for _ in range(_MAX_RESOLVE_ROUNDS):
            try:
                return resolve_values(self.serde, versions, heads, entries,
                                      empty=doc.get("empty") or (),
                                      schema_version=schema_version, lift=lift, absent=absent,
                                      known=known)
            except MissingBlobs as missing:
                scope = {"thread_id": doc["thread_id"], "checkpoint_ns": doc["checkpoint_ns"]}
                fetched = yield Aggregate(
                    self.checkpoints, self._holders_pipeline(scope, sorted(missing.keys))
                )
                for found in fetched:
                    entries.update((e["k"], e) for e in holder_entries(found))
                yield from fill(self.chunks, scope, entries.items())
                absent |= missing.keys - entries.keys()
        raise CorruptDocumentError(
            f"checkpoint {doc['checkpoint_id']} of thread {doc['thread_id']!r}: "
            "stored values form a chain that does not resolve"
        )

    # --- delta channel history --------------------------------------------------------

    def delta_history(
        self, config: RunnableConfig, channels: Sequence[str]
    ) -> Plan[dict[str, DeltaChannelHistory]]:
        """Per-channel writes and seed along the parent chain, in two queries at any depth.

        The first query streams the thread's checkpoint skeletons newest first and walks
        the parent chain in memory, stopping as soon as every channel found its seed; the
        second fetches the on-path writes and the seed values together. Writes and seeds
        stored under an older schema come back migrated, under the current names.
        """
        if not channels:
            return {}
        target = target_of(config)
        scope = {"thread_id": target.thread_id, "checkpoint_ns": target.checkpoint_ns}
        if target.checkpoint_id is not None:
            prefetched = self.cache.take_prefetched(
                (target.thread_id, target.checkpoint_ns, target.checkpoint_id))
            if prefetched is not None:
                served = yield from self._history_from_prefetch(target, channels, *prefetched)
                if served is not None:
                    return served
        id_bound: Document = {"$lte": target.checkpoint_id} if target.checkpoint_id else {}
        query = Find(
            self.checkpoints,
            {**scope, **({"checkpoint_id": id_bound} if id_bound else {})},
            projection={"_id": 0, "checkpoint_id": 1, "parent_checkpoint_id": 1,
                        "checkpoint.channel_versions": 1, "values.k": 1, "values.kind": 1,
                        "heads": 1, "empty": 1, "schema_version": 1, "format": 1, "type": 1},
            sort=[("checkpoint_id", DESCENDING)],
        )
        walk = AncestorWalk(channels, target.checkpoint_id, self.upgrader.current_header)
        cursor = yield OpenCursor(query, STREAM_BATCH * 4)
        while not walk.done and (found := (yield NextBatch(cursor, STREAM_BATCH * 4))):
            for doc in found:
                if is_legacy(doc):
                    yield from self.convert_legacy_thread(target.thread_id)
                    return (yield from self.delta_history(config, channels))
                walk.visit(doc)
                if walk.done:
                    break
        if not walk.path:
            return {ch: {"writes": []} for ch in channels}
        known, skip = self._known(scope)
        wanted_keys = sorted({*walk.seed_keys.values(), *walk.pending_keys()} - known.keys())
        names = sorted({n for ch in channels
                        for n in self.upgrader.migrations.historical_names(ch, 1)})
        pipeline: list[Document] = [
            # Every channel: a batch is only known whole when all its writes are counted.
            {"$match": {**scope, "checkpoint_id": {"$in": walk.path_ids()}}},
            {"$sort": {"checkpoint_id": 1, "task_path": 1, "task_id": 1, "idx": 1}},
        ]
        if wanted_keys:
            pipeline.append({"$unionWith": {
                "coll": self.checkpoints,
                "pipeline": self._holders_pipeline(scope, wanted_keys, skip),
            }})
        found = yield Aggregate(self.writes, pipeline)
        ctx = MigrationContext(target.thread_id, target.checkpoint_id or "(latest)")
        entries = {e["k"]: e for d in found if "blob_docs" in d for e in holder_entries(d)}
        found = [*(d for d in docs_.complete_writes([d for d in found if "blob_docs" not in d])
                   if d["channel"] in names),
                 *(d for d in found if "blob_docs" in d)]
        yield from fill(self.chunks, scope, [
            *((spill_write_key(d), d["value"]) for d in found
              if "blob_docs" not in d and isinstance(d.get("value"), dict)),
            *entries.items(),
        ])
        writes = []
        for doc in found:
            if "blob_docs" not in doc and (write := self.upgrader.write(doc, ctx)) is not None:
                writes.append((doc["checkpoint_id"], write))
        walk.finish({**{k: "full" for k in known}, **{k: "full" for k in entries}})
        seeds: dict[str, Any] = {}
        if walk.seed_keys:
            seed_doc = {**scope, "checkpoint_id": target.checkpoint_id or "(latest)",
                        "checkpoint": {"channel_versions": docs_.escape_keys(
                            {ch: walk.seed_versions[ch] for ch in walk.seed_keys}, "channel")},
                        "heads": docs_.escape_keys(walk.seed_keys, "channel")}
            seeds, _ = yield from self._resolve(
                seed_doc, entries, self.upgrader.current_schema_version, ctx, known
            )
        return walk.result(writes, seeds)

    def _history_from_prefetch(
        self,
        target: Target,
        channels: Sequence[str],
        parent_id: str | None,
        skeletons: list[Document],
        writes: list[Document],
    ) -> Plan[dict[str, DeltaChannelHistory] | None]:
        """Delta history from what `get_tuple` fetched ahead, with no query when the seeds
        are values this process holds; None when the prefetch does not settle it."""
        current = self.upgrader.current_schema_version
        if any(d.get("schema_version") != current for d in [*skeletons, *writes]):
            return None  # older names or shapes: the full path migrates them
        walk = AncestorWalk(channels, target.checkpoint_id, self.upgrader.current_header)
        walk.visit({"checkpoint_id": target.checkpoint_id, "parent_checkpoint_id": parent_id,
                    "checkpoint": {}})
        for doc in sorted(skeletons, key=lambda d: d["checkpoint_id"], reverse=True):
            if walk.done:
                break
            walk.visit(doc)
        known, _ = self._known(
            {"thread_id": target.thread_id, "checkpoint_ns": target.checkpoint_ns}
        )
        # A pending key is a value introduced before the prefetched range: decided only
        # if this process holds it (held values are never empty).
        if any(k not in known for k in walk.pending_keys()):
            return None
        walk.finish({k: "full" for k in walk.pending_keys()})
        settled = not walk.remaining or walk.path_ended
        if not settled or any(k not in known for k in walk.seed_keys.values()):
            return None
        scope = {"thread_id": target.thread_id, "checkpoint_ns": target.checkpoint_ns}
        writes = [d for d in docs_.complete_writes(writes) if d["channel"] in channels]
        yield from fill(self.chunks, scope, [
            (spill_write_key(d), d["value"]) for d in writes if isinstance(d.get("value"), dict)
        ])
        ctx = MigrationContext(target.thread_id, target.checkpoint_id or "")
        decoded = [(d["checkpoint_id"], self.upgrader.write(d, ctx)) for d in writes]
        seeds: dict[str, Any] = {
            ch: known[key].known_value() for ch, key in walk.seed_keys.items()
        }
        return walk.result([(cid, w) for cid, w in decoded if w is not None], seeds)

    def convert_legacy_thread(self, thread_id: str) -> Plan[int]:
        """Rewrite a thread's langgraph-checkpoint-mongodb documents in the current layout."""
        if not self.upgrader.write_back:
            raise MigrationError(
                f"thread {thread_id!r} holds langgraph-checkpoint-mongodb documents that this "
                "operation needs converted; enable write-back or run `mongo-saver migrate`"
            )
        converted = 0
        cursor = yield OpenCursor(
            Find(self.checkpoints, {"thread_id": thread_id, "format": {"$exists": False}}),
            STREAM_BATCH,
        )
        while found := (yield NextBatch(cursor, STREAM_BATCH)):
            for stored in found:
                if not is_legacy(stored):
                    continue
                doc, _ = self.upgrader.normalize(stored)
                yield BulkWrite(self.checkpoints, [ReplaceOne(
                    {"_id": stored["_id"], "format": {"$exists": False}},
                    {k: v for k, v in doc.items() if k not in ("_id", "pending")},
                )])
                converted += 1
        writes = yield Find(self.writes, {"thread_id": thread_id, "format": {"$exists": False}})
        requests = [
            ReplaceOne({"_id": w["_id"], "format": {"$exists": False}},
                       {k: v for k, v in convert_write(self.serde, w).items() if k != "_id"})
            for w in writes if is_legacy_write(w)
        ]
        if requests:
            yield BulkWrite(self.writes, requests)
        return converted

    # --- deleting and copying ---------------------------------------------------------

    def delete_thread(self, thread_id: str) -> Plan[None]:
        require_id("thread_id", thread_id)
        self.cache.discard_thread(thread_id)
        yield DeleteMany(self.checkpoints, {"thread_id": thread_id})
        yield DeleteMany(self.writes, {"thread_id": thread_id})
        yield DeleteMany(self.chunks, {"thread_id": thread_id})

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> Plan[None]:
        """Copy every checkpoint and write (the whole parent chain), idempotently."""
        require_id("source thread_id", source_thread_id)
        require_id("target thread_id", target_thread_id)
        for collection, identity in (
            (self.chunks, CHUNK_IDENTITY),
            (self.checkpoints, ("thread_id", "checkpoint_ns", "checkpoint_id")),
            (self.writes, docs_.WRITE_IDENTITY),
        ):
            cursor = yield OpenCursor(
                Find(collection, {"thread_id": source_thread_id}, projection={"_id": 0}),
                STREAM_BATCH,
            )
            while found := (yield NextBatch(cursor, STREAM_BATCH)):
                requests = []
                for doc in found:
                    doc["thread_id"] = target_thread_id
                    key = {f: doc[f] for f in identity}
                    requests.append(ReplaceOne(key, doc, upsert=True))
                yield BulkWrite(collection, requests)

    def prune(self, thread_ids: Sequence[str], strategy: str) -> Plan[None]:
        if strategy not in ("keep_latest", "delete"):
            raise InvalidInputError(f"unknown prune strategy {strategy!r}")
        for thread_id in thread_ids:
            require_id("thread_id", thread_id)
        for thread_id in thread_ids:
            if strategy == "delete":
                yield from self.delete_thread(thread_id)
                continue
            skeletons = yield from self._skeletons({"thread_id": thread_id})
            keep: set[tuple[str, str]] = set()
            latest: dict[str, str] = {}
            for doc in skeletons:
                ns = doc["checkpoint_ns"]
                latest[ns] = max(latest.get(ns, ""), doc["checkpoint_id"])
            keep = {(ns, cid) for ns, cid in latest.items()}
            yield from self._apply_removal(plan_removal(skeletons, keep))

    def delete_for_runs(self, run_ids: Sequence[str]) -> Plan[None]:
        """Delete the checkpoints of these runs, keeping what surviving ones still need."""
        run_list = [require_id("run_id", r) for r in run_ids]
        if not run_list:
            return
        doomed = yield Find(
            self.checkpoints,
            {"metadata.run_id": {"$in": run_list}},
            projection={"_id": 0, "thread_id": 1},
        )
        for thread_id in sorted({d["thread_id"] for d in doomed}):
            skeletons = yield from self._skeletons({"thread_id": thread_id})
            keep = {
                (d["checkpoint_ns"], d["checkpoint_id"])
                for d in skeletons
                if d.get("metadata", {}).get("run_id") not in run_list
            }
            yield from self._apply_removal(plan_removal(skeletons, keep))

    def _skeletons(self, match: Document) -> Plan[list[Document]]:
        cursor = yield OpenCursor(
            Find(
                self.checkpoints,
                match,
                projection={"_id": 1, "thread_id": 1, "checkpoint_ns": 1, "checkpoint_id": 1,
                            "parent_checkpoint_id": 1, "checkpoint.channel_versions": 1,
                            "blob_keys": 1, "heads": 1, "empty": 1, "values.k": 1,
                            "values.kind": 1,
                            "values.prev": 1, "metadata.run_id": 1,
                            f"metadata.{DELTA_COUNTERS}": 1},
            ),
            STREAM_BATCH * 4,
        )
        skeletons: list[Document] = []
        while found := (yield NextBatch(cursor, STREAM_BATCH * 4)):
            skeletons.extend(found)
        return skeletons

    def _apply_removal(self, plan: RemovalPlan) -> Plan[None]:
        """Move still-needed value entries to a survivor, then delete; safe to re-run."""
        for (thread_id, ns), (survivor_id, keys) in plan.moves.items():
            holders = yield Aggregate(
                self.checkpoints,
                [
                    {"$match": {"thread_id": thread_id, "checkpoint_ns": ns,
                                "values.k": {"$in": sorted(keys)}}},
                    {"$project": {"_id": 0, "values": {"$filter": {
                        "input": "$values", "cond": {"$in": ["$$this.k", sorted(keys)]}}}}},
                ],
            )
            moved = {e["k"]: e for h in holders for e in h["values"]}
            if moved:
                yield UpdateOne_(
                    self.checkpoints,
                    {"_id": survivor_id},
                    {"$push": {"values": {"$each": list(moved.values())}}},
                )
        for (thread_id, ns), checkpoint_ids in plan.deletions.items():
            for chunk in _chunks(sorted(checkpoint_ids)):
                scope = {"thread_id": thread_id, "checkpoint_ns": ns,
                         "checkpoint_id": {"$in": list(chunk)}}
                yield DeleteMany(self.checkpoints, scope)
                yield DeleteMany(self.writes, scope)
                moved_keys = sorted(plan.moves.get((thread_id, ns), (None, set()))[1])
                yield DeleteMany(self.chunks, {**scope, "key": {"$nin": moved_keys}})
            self.cache.discard_thread(thread_id)
