"""Every document read passes through here: version checks, legacy layouts, migrations.

`DocumentUpgrader` turns a stored checkpoint of any known layout and schema version into
the current one, in memory, and produces the write-back: a compare-and-swap update that
only applies if the stored document still has the versions it was read with, so a
concurrent reader or writer never loses an update. Old value entries are never rewritten
(other checkpoints may share them); they carry their own schema version and are lifted
when read. A document newer than this code is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from langgraph.checkpoint.base import Checkpoint, PendingWrite
from langgraph.checkpoint.serde.base import SerializerProtocol
from pymongo.operations import DeleteOne, ReplaceOne, UpdateOne

from mongo_saver import documents as docs_
from mongo_saver import legacy
from mongo_saver.documents import FORMAT_VERSION, blob_key
from mongo_saver.errors import MigrationError, SchemaVersionError
from mongo_saver.migrations import (
    DROPPED,
    MigrationContext,
    MigrationStep,
    SchemaMigrations,
    apply_raw_steps,
    migrate_header,
    migrate_value,
)
from mongo_saver.ops import BulkWrite, Document
from mongo_saver.values import (
    IMMUTABLE_TYPES,
    UNKNOWN,
    ChannelState,
    StoredChannel,
    full_entry,
    list_items,
    restate,
)


class _Write(NamedTuple):
    """A pending write being migrated, with the schema version it is at."""

    task_id: str
    channel: str
    value: Any
    version: int

    @property
    def pending(self) -> PendingWrite:
        return (self.task_id, self.channel, self.value)


@dataclass
class Upgraded:
    """A checkpoint brought to the current schema, and how to store that."""

    checkpoint: Checkpoint
    pending_writes: list[PendingWrite]
    state: ChannelState
    write_back: list[BulkWrite] = field(default_factory=list)


class DocumentUpgrader:
    """Brings stored documents to the current layout and application schema."""

    def __init__(
        self,
        serde: SerializerProtocol,
        *,
        checkpoints: str,
        writes: str,
        migrations: SchemaMigrations | None = None,
        write_back: bool = True,
    ) -> None:
        self.serde = serde
        self.checkpoints = checkpoints
        self.writes = writes
        self.migrations = migrations or SchemaMigrations()
        self.current_schema_version = self.migrations.current_version
        self.write_back = write_back

    # --- checks ---------------------------------------------------------------------------

    def check(self, doc: Mapping[str, Any]) -> None:
        fmt, schema = doc.get("format"), doc.get("schema_version")
        where = f"checkpoint {doc.get('checkpoint_id')} of thread {doc.get('thread_id')!r}"
        if isinstance(fmt, int) and fmt > FORMAT_VERSION:
            raise SchemaVersionError(
                f"{where} has storage format {fmt}, newer than this mongo-saver "
                f"(format {FORMAT_VERSION}); upgrade mongo-saver instead of reading it"
            )
        if isinstance(schema, int) and schema > self.current_schema_version:
            raise SchemaVersionError(
                f"{where} has schema_version {schema}, newer than this application's "
                f"migrations (version {self.current_schema_version}); "
                "was a deploy rolled back?"
            )

    def normalize(self, doc: Document) -> tuple[Document, bool]:
        """The document in the current layout (converted if legacy), and whether it was."""
        self.check(doc)
        if legacy.is_legacy(doc):
            converted = legacy.convert_checkpoint(self.serde, doc)
            converted["pending"] = doc.get("pending", [])
            return converted, True
        return doc, False

    def needs_upgrade(self, doc: Mapping[str, Any]) -> bool:
        return (
            legacy.is_legacy(doc)
            or doc.get("schema_version", 1) < self.current_schema_version
            or any(
                legacy.is_legacy_write(w)
                or w.get("schema_version", 1) < self.current_schema_version
                for w in doc.get("pending", [])
            )
        )

    # --- values and writes ------------------------------------------------------------------

    def path(self, from_version: int, to_version: int | None = None) -> list[MigrationStep]:
        return self.migrations.path(from_version, to_version)

    def lift(self, ctx: MigrationContext) -> Any:
        """The `values.Lift` for one checkpoint: declarative steps only (see `raw`)."""

        def lift(channel: str, value: Any, from_version: int, to_version: int) -> tuple[str, Any]:
            if self.migrations.crosses_raw(from_version, to_version):
                raise MigrationError(
                    f"thread {ctx.thread_id!r}, checkpoint {ctx.checkpoint_id}: a value of "
                    f"{channel!r} stored at schema {from_version} would cross a raw migration "
                    "step outside a whole checkpoint; run `mongo-saver migrate` on this thread"
                )
            return migrate_value(self.path(from_version, to_version), channel, value, ctx)

        return lift

    def write(self, doc: Mapping[str, Any], ctx: MigrationContext) -> PendingWrite | None:
        """One stored pending write at the current schema; None if a migration dropped it."""
        task_id, channel, value, version = self._decode_write(doc)
        if version < self.current_schema_version:
            if self.migrations.crosses_raw(version):
                raise MigrationError(
                    f"thread {ctx.thread_id!r}: a write stored at schema {version} crosses a "
                    "raw migration step outside a whole checkpoint; run `mongo-saver migrate`"
                )
            channel, value = migrate_value(self.path(version), channel, value, ctx)
            if value is DROPPED:
                return None
        return task_id, channel, value

    def stored_heads(self, doc: Mapping[str, Any]) -> dict[str, str]:
        return docs_.unescape_keys(doc.get("heads") or {})

    def current_header(self, doc: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """Channel versions and head keys of a stored checkpoint, under current names."""
        versions = docs_.channel_versions_of(doc)
        stored_heads = self.stored_heads(doc)
        heads = {ch: stored_heads.get(ch) or blob_key(ch, v) for ch, v in versions.items()}
        version = doc.get("schema_version", legacy.LEGACY_SCHEMA_VERSION)
        if version < self.current_schema_version:
            versions, _, heads, _, _ = migrate_header(self.path(version), versions, {},
                                                      heads, None)
        return versions, heads

    # --- whole checkpoints ------------------------------------------------------------------

    def upgrade(
        self,
        doc: Document,
        checkpoint: Checkpoint,
        state: ChannelState,
        was_legacy: bool,
        original_id: Any,
    ) -> Upgraded:
        """Carry a checkpoint resolved at its stored schema to the current one, step by
        step: declared operations first, then the step's raw function, if any, on the
        whole checkpoint and its pending writes."""
        ctx = MigrationContext(doc["thread_id"], doc["checkpoint_id"])
        pending_docs = doc.get("pending", [])
        writes: list[_Write | None] = [self._decode_write(d) for d in pending_docs]
        version = doc["schema_version"]
        heads = {ch: self.stored_heads(doc).get(ch) or blob_key(ch, v)
                 for ch, v in checkpoint["channel_versions"].items()}
        first = min([version, *(w.version for w in writes if w is not None)])
        for step in self.path(first):
            if step.version >= version:
                checkpoint, state, heads = self._migrate_checkpoint(
                    step, checkpoint, state, heads, ctx)
            for i, w in enumerate(writes):
                if w is not None and w.version <= step.version:
                    channel, value = migrate_value([step], w.channel, w.value, ctx)
                    writes[i] = None if value is DROPPED else _Write(
                        w.task_id, channel, value, step.version + 1)
            if step.is_raw and step.version >= version:
                checkpoint, writes = self._raw(step, checkpoint, writes, ctx)
                state = {ch: restate(s, stale=True) for ch, s in state.items()}
        upgraded = Upgraded(checkpoint, [w.pending for w in writes if w is not None], state)
        if self.write_back:
            upgraded.write_back = self._write_back(doc, upgraded, was_legacy, original_id,
                                                   list(zip(pending_docs, writes, strict=True)),
                                                   ctx)
        return upgraded

    def _decode_write(self, doc: Mapping[str, Any]) -> _Write:
        stored = legacy.convert_write(self.serde, doc) if legacy.is_legacy_write(doc) else doc
        task_id, channel, value = docs_.write_from_document(self.serde, stored)
        return _Write(task_id, channel, value, stored.get("schema_version", 1))

    def _raw(
        self,
        step: MigrationStep,
        checkpoint: Checkpoint,
        writes: list[_Write | None],
        ctx: MigrationContext,
    ) -> tuple[Checkpoint, list[_Write | None]]:
        """Run a raw step; it may change pending writes but not add or remove them."""
        live = [i for i, w in enumerate(writes) if w is not None]
        changed, new = apply_raw_steps(
            [step], dict(checkpoint), [w.pending for w in writes if w is not None], ctx
        )
        if len(new) != len(live):
            raise ctx.fail(step, ValueError(
                f"a raw step must keep the number of pending writes ({len(live)} in, "
                f"{len(new)} out)"))
        out = list(writes)
        for i, (task_id, channel, value) in zip(live, new, strict=True):
            out[i] = _Write(task_id, channel, value, step.version + 1)
        return changed, out  # type: ignore[return-value]

    def _migrate_checkpoint(
        self,
        step: MigrationStep,
        checkpoint: Checkpoint,
        state: ChannelState,
        heads: dict[str, str],
        ctx: MigrationContext,
    ) -> tuple[Checkpoint, ChannelState, dict[str, str]]:
        """One step's declared operations on a whole checkpoint and its channel state."""
        steps = [step]
        values: dict[str, Any] = {}
        for channel, value in checkpoint["channel_values"].items():
            name, migrated = migrate_value(steps, channel, value, ctx)
            if migrated is not DROPPED:
                values[name] = migrated
        versions, seen, heads, updated, added = migrate_header(
            steps,
            dict(checkpoint["channel_versions"]),
            checkpoint["versions_seen"],
            heads,
            checkpoint.get("updated_channels"),
        )
        new_state: ChannelState = {}
        old_names = _old_names(steps, list(state))
        for name, version in versions.items():
            if name in added:
                values.setdefault(name, added[name])
                key = blob_key(name, version)
                new_state[name] = StoredChannel(version, key, (key,), stale=True)
                continue
            old = old_names.get(name)
            stored = state.get(old) if old is not None else None
            if stored is None:
                continue
            value = values.get(name, UNKNOWN)
            items, snapshot = list_items(value)
            new_state[name] = restate(
                stored,
                key=heads.get(name, stored.key),
                items=tuple(items) if items is not None else None,
                snapshot=snapshot,
                scalar=value if isinstance(value, IMMUTABLE_TYPES) else UNKNOWN,
            )
        result: dict[str, Any] = {
            **checkpoint,
            "channel_values": values,
            "channel_versions": versions,
            "versions_seen": seen,
            "updated_channels": updated,
        }
        return result, new_state, heads  # type: ignore[return-value]

    def _write_back(
        self,
        doc: Document,
        upgraded: Upgraded,
        was_legacy: bool,
        original_id: Any,
        pending: Sequence[tuple[Mapping[str, Any], _Write | None]],
        ctx: MigrationContext,
    ) -> list[BulkWrite]:
        """Compare-and-swap updates storing the upgraded checkpoint and its writes."""
        current = self.current_schema_version
        checkpoint = upgraded.checkpoint
        materialized = []
        for channel, stored in list(upgraded.state.items()):
            if stored.stale and channel in checkpoint["channel_values"]:
                entry, upgraded.state[channel] = full_entry(
                    self.serde, channel, f"{blob_key(channel, stored.version)}@{current}",
                    checkpoint["channel_values"][channel],
                    f"channel {channel!r} of thread {ctx.thread_id!r}", current, stored.version,
                )
                materialized.append(entry)
        own = {e["k"] for e in [*doc.get("values", []), *materialized]}
        state = upgraded.state
        fields = {
            "format": FORMAT_VERSION,
            "schema_version": current,
            "checkpoint": docs_.checkpoint_header(self.serde, checkpoint),
            "heads": docs_.escape_keys(
                {ch: s.key for ch, s in state.items() if s.key != blob_key(ch, s.version)},
                "channel",
            ),
            "empty": [ch for ch, s in state.items() if s.empty],
            "blob_keys": sorted({k for s in state.values() for k in s.chain} - own),
        }
        ops: list[BulkWrite] = []
        if was_legacy:
            replacement = {k: v for k, v in doc.items() if k not in ("pending", "blob_docs")}
            replacement.update(fields)
            replacement["values"] = [*doc.get("values", []), *materialized]
            replacement.pop("_id", None)
            cas: dict[str, Any] = {"_id": original_id, "format": {"$exists": False}}
            ops.append(BulkWrite(self.checkpoints, [ReplaceOne(cas, replacement)]))
        else:
            cas = {"_id": original_id, "schema_version": doc["schema_version"],
                   "format": doc["format"]}
            update: dict[str, Any] = {"$set": fields}
            if materialized:
                update["$push"] = {"values": {"$each": materialized}}
            ops.append(BulkWrite(self.checkpoints, [UpdateOne(cas, update)]))
        write_ops: list[Any] = []
        for write_doc, write in pending:
            if "_id" not in write_doc:
                continue
            old_version = write_doc.get("schema_version")
            if old_version == current and not legacy.is_legacy_write(write_doc):
                continue
            cas = {"_id": write_doc["_id"], "schema_version": old_version}
            if legacy.is_legacy_write(write_doc):
                cas = {"_id": write_doc["_id"], "format": {"$exists": False}}
            if write is None:
                write_ops.append(DeleteOne(cas))
                continue
            write_ops.append(UpdateOne(cas, {
                "$set": {"channel": write.channel, "format": FORMAT_VERSION,
                         "schema_version": current,
                         "value": docs_.dump_typed(self.serde, write.value,
                                                   f"write to {write.channel!r}")},
                "$unset": {"type": ""},
            }))
        if write_ops:
            ops.append(BulkWrite(self.writes, write_ops))
        return ops


def _old_names(steps: Sequence[MigrationStep], names: list[str]) -> dict[str, str]:
    """Current name -> stored name, for channels that survive `steps`."""
    out = {}
    for name in names:
        versions, _, _, _, added = migrate_header(steps, {name: 0}, {}, {}, None)
        for new in versions.keys() - added.keys():
            out[new] = name
    return out
