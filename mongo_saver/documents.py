"""Pure functions between LangGraph objects and the BSON documents we store.

Nothing here does I/O. Both savers, the migration layer and the CLI build and read
documents only through these functions, so the stored layout is defined in one place.

Layout (format 1), one document per checkpoint in the checkpoints collection::

    {thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
     format, schema_version, created_at,
     checkpoint: {v, ts, channel_versions, versions_seen, updated_channels, extra?},
     metadata: {...native BSON, queryable...},
     values: [value entry, ...],      # the channel versions this checkpoint introduced
     blob_keys: [key, ...],           # every value entry needed to rebuild its state
     size}

and one document per pending write in the writes collection. Field names that come from
users (channels, nodes, metadata keys) are percent-escaped so that `.` and a leading `$`
never reach MongoDB's query language.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from mongo_saver.errors import CorruptDocumentError, InvalidInputError

FORMAT_VERSION = 1
"""The storage layout written by this code; older layouts are read and upgraded."""

TYPED_MARKER = "__mongo_saver_typed__"
"""Key of the wrapper for metadata leaves that BSON cannot hold natively."""

_KNOWN_CHECKPOINT_KEYS = frozenset(
    {"v", "id", "ts", "channel_values", "channel_versions", "versions_seen", "updated_channels"}
)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


# --- validation -------------------------------------------------------------------------


def require_id(name: str, value: object, *, allow_empty: bool = False) -> str:
    """Return `value` if it is a usable id string, else raise naming `name`."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise InvalidInputError(f"{name} must not be empty")
    if "\x00" in value:
        raise InvalidInputError(f"{name} {value!r} contains a NUL byte")
    return value


def require_name(kind: str, name: object) -> str:
    """Validate a user-supplied name (channel, node, metadata key) that becomes a field."""
    if not isinstance(name, str):
        raise InvalidInputError(f"{kind} name must be a string, got {name!r}")
    if "\x00" in name:
        raise InvalidInputError(f"{kind} name {name!r} contains a NUL byte")
    return name


# --- field-name escaping ---------------------------------------------------------------


def escape_field(name: str, kind: str = "key") -> str:
    """Percent-escape a user name so it is a plain BSON field name (no `.`, no leading `$`)."""
    require_name(kind, name)
    escaped = name.replace("%", "%25").replace(".", "%2E")
    if escaped.startswith("$"):
        escaped = "%24" + escaped[1:]
    return escaped


_ESCAPE = re.compile(r"%(25|2E|24)")
_UNESCAPED = {"25": "%", "2E": ".", "24": "$"}


def unescape_field(name: str) -> str:
    """Invert `escape_field`."""
    return _ESCAPE.sub(lambda m: _UNESCAPED[m.group(1)], name)


def escape_keys(mapping: Mapping[str, Any], kind: str) -> dict[str, Any]:
    return {escape_field(k, kind): v for k, v in mapping.items()}


def unescape_keys(mapping: Mapping[str, Any]) -> dict[str, Any]:
    return {unescape_field(k): v for k, v in mapping.items()}


# --- serializer-typed payloads ----------------------------------------------------------


def dump_typed(serde: SerializerProtocol, value: Any, what: str) -> dict[str, Any]:
    """Serialize `value` as `{t, d, h}`, naming `what` if the serializer refuses it.

    `h` is a CRC-32 of the bytes: a damaged payload can still decode (a flipped byte
    in msgpack is often another valid value), so only a checksum makes it loud.
    """
    try:
        type_, data = serde.dumps_typed(value)
    except Exception as exc:  # the serializer's own error types vary
        raise InvalidInputError(
            f"cannot serialize {what} (a {type(value).__name__}): {exc}"
        ) from exc
    return {"t": type_, "d": data, "h": zlib.crc32(data)}


def load_typed(serde: SerializerProtocol, payload: Mapping[str, Any], what: str) -> Any:
    """Deserialize a `{t, d[, h]}` payload, raising `CorruptDocumentError` naming `what`."""
    try:
        data = bytes(payload["d"])
        if "h" in payload and zlib.crc32(data) != payload["h"]:
            raise ValueError("checksum mismatch: the stored bytes were changed or damaged")
        return serde.loads_typed((payload["t"], data))
    except Exception as exc:
        raise CorruptDocumentError(f"cannot decode {what}: {exc}") from exc


# --- metadata as native BSON ------------------------------------------------------------


def metadata_to_bson(serde: SerializerProtocol, value: Any, path: str = "metadata") -> Any:
    """Encode metadata so that every JSON-like leaf stays native and queryable."""
    if value is None or isinstance(value, (bool, str, float, bytes, dt.datetime)):
        if isinstance(value, str) and "\x00" in value:
            raise InvalidInputError(f"{path} contains a NUL byte")
        return value
    if isinstance(value, int):
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
    elif isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {
                escape_field(k, f"{path} key"): metadata_to_bson(serde, v, f"{path}.{k}")
                for k, v in value.items()
            }
    elif isinstance(value, (list, tuple)):
        return [metadata_to_bson(serde, v, f"{path}[{i}]") for i, v in enumerate(value)]
    return {TYPED_MARKER: dump_typed(serde, value, path)}


def metadata_from_bson(serde: SerializerProtocol, value: Any) -> Any:
    """Invert `metadata_to_bson`."""
    if isinstance(value, Mapping):
        if TYPED_MARKER in value:
            return load_typed(serde, value[TYPED_MARKER], "a metadata value")
        return {unescape_field(k): metadata_from_bson(serde, v) for k, v in value.items()}
    if isinstance(value, list):
        return [metadata_from_bson(serde, v) for v in value]
    return value


def metadata_filter(
    serde: SerializerProtocol,
    filter: Mapping[str, Any],
    other_encodings: Callable[[Any], list[Any]] | None = None,
) -> dict[str, Any]:
    """Turn a `list(filter=...)` mapping into a MongoDB query on `metadata.*`.

    Keys are metadata keys; a dotted key (`"parents.sub"`) is a nested path, and a dict
    value matches its leaves by nested path. Anything that looks like a query operator is
    refused, so a filter can only ever express equality. `other_encodings` gives other
    stored forms of a leaf (older layouts) that match as well.
    """
    clauses: list[dict[str, Any]] = []

    def add(path: list[str], value: Any) -> None:
        if isinstance(value, Mapping) and value and TYPED_MARKER not in value:
            for k, v in value.items():
                add([*path, _filter_segment(k)], v)
            return
        _refuse_operators(value, ".".join(path))
        field = "metadata." + ".".join(path)
        forms = [metadata_to_bson(serde, value)]
        if other_encodings is not None:
            forms += other_encodings(value)
        clauses.append(
            {field: forms[0]} if len(forms) == 1 else {"$or": [{field: f} for f in forms]}
        )

    for key, value in filter.items():
        if not isinstance(key, str) or not key:
            raise InvalidInputError(f"filter key must be a non-empty string, got {key!r}")
        add([_filter_segment(seg) for seg in key.split(".")], value)
    if len(clauses) == 1:
        return clauses[0]
    return {"$and": clauses} if clauses else {}


def _filter_segment(segment: object) -> str:
    if not isinstance(segment, str) or not segment:
        raise InvalidInputError(f"filter key segment must be a non-empty string: {segment!r}")
    if segment.startswith("$"):
        raise InvalidInputError(f"filter key {segment!r} is a query operator; only equality")
    return escape_field(segment, "filter key")


def _refuse_operators(value: Any, where: str) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(k, str) and k.startswith("$"):
                raise InvalidInputError(f"filter value at {where!r} contains operator {k!r}")
            _refuse_operators(v, where)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _refuse_operators(v, where)


# --- checkpoints --------------------------------------------------------------------------


def checkpoint_header(serde: SerializerProtocol, checkpoint: Checkpoint) -> dict[str, Any]:
    """Everything of a checkpoint except its channel values, as native BSON."""
    header: dict[str, Any] = {
        "v": checkpoint.get("v", 1),
        "ts": checkpoint["ts"],
        "channel_versions": escape_keys(checkpoint["channel_versions"], "channel"),
        "versions_seen": {
            escape_field(node, "node"): escape_keys(seen, "channel")
            for node, seen in checkpoint["versions_seen"].items()
        },
        "updated_channels": checkpoint.get("updated_channels"),
    }
    extra = {k: v for k, v in checkpoint.items() if k not in _KNOWN_CHECKPOINT_KEYS}
    if extra:
        header["extra"] = dump_typed(serde, extra, "checkpoint fields")
    return header


def checkpoint_from_header(
    serde: SerializerProtocol,
    header: Mapping[str, Any],
    checkpoint_id: str,
    channel_values: dict[str, Any],
) -> Checkpoint:
    """Rebuild a `Checkpoint` from its stored header and resolved channel values."""
    checkpoint: dict[str, Any] = {
        "v": header.get("v", 1),
        "id": checkpoint_id,
        "ts": header["ts"],
        "channel_values": channel_values,
        "channel_versions": unescape_keys(header.get("channel_versions", {})),
        "versions_seen": {
            unescape_field(node): unescape_keys(seen)
            for node, seen in header.get("versions_seen", {}).items()
        },
        "updated_channels": header.get("updated_channels"),
    }
    if "extra" in header:
        checkpoint.update(load_typed(serde, header["extra"], f"checkpoint {checkpoint_id}"))
    return checkpoint  # type: ignore[return-value]


def channel_versions_of(doc: Mapping[str, Any]) -> ChannelVersions:
    return unescape_keys(doc["checkpoint"].get("channel_versions", {}))


def head_keys(doc: Mapping[str, Any]) -> dict[str, str]:
    """Channel -> key of its value entry, for every channel with a stored value."""
    versions = channel_versions_of(doc)
    heads = unescape_keys(doc.get("heads") or {})
    empty = set(doc.get("empty") or ())
    return {ch: heads.get(ch) or blob_key(ch, v) for ch, v in versions.items() if ch not in empty}


def value_kinds(doc: Mapping[str, Any]) -> dict[str, str]:
    """Key -> "full" or "append" for the entries a document holds, and "empty" for the
    versions it names as having no stored value."""
    versions = channel_versions_of(doc)
    heads = unescape_keys(doc.get("heads") or {})
    kinds = {e["k"]: e.get("kind", "full") for e in doc.get("values") or ()}
    for ch in doc.get("empty") or ():
        if ch in versions:
            kinds[heads.get(ch) or blob_key(ch, versions[ch])] = "empty"
    return kinds


def blob_key(channel: str, version: str | int | float) -> str:
    """Identify one stored version of one channel within a thread and namespace.

    The channel's length prefixes it so no channel name can forge another's key; the
    type tag keeps the integer 1 and the string "1" apart.
    """
    tag = "s" if isinstance(version, str) else ("f" if isinstance(version, float) else "i")
    return f"{len(channel)}:{channel}:{tag}{version}"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --- pending writes -----------------------------------------------------------------------


def write_index(channel: str, position: int) -> int:
    """Special channels (errors, interrupts...) take a fixed negative slot and overwrite."""
    return WRITES_IDX_MAP.get(channel, position)


def write_documents(
    serde: SerializerProtocol,
    *,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str,
    task_id: str,
    task_path: str,
    writes: Sequence[tuple[str, Any]],
    schema_version: int,
) -> list[dict[str, Any]]:
    """Build the documents for one `put_writes` call; serialization errors name the channel."""
    require_id("task_id", task_id)
    require_id("task_path", task_path, allow_empty=True)
    now = utcnow()
    batch = write_batch_id(task_id, task_path, [channel for channel, _ in writes])
    docs = []
    for position, (channel, value) in enumerate(writes):
        require_name("channel", channel)
        payload = dump_typed(
            serde, value, f"write to channel {channel!r} of thread {thread_id!r}"
        )
        docs.append(
            {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint_id,
                "task_id": task_id,
                "task_path": task_path,
                "idx": write_index(channel, position),
                "channel": channel,
                "value": payload,
                "batch": batch,
                "of": len(writes),
                "format": FORMAT_VERSION,
                "schema_version": schema_version,
                "created_at": now,
            }
        )
    return docs


def write_batch_id(task_id: str, task_path: str, channels: Sequence[str]) -> str:
    """Names one `put_writes` call, the same when a failed call is retried."""
    digest = hashlib.blake2b(digest_size=8)
    for part in (task_id, task_path, *channels):
        digest.update(part.encode() + b"\x00")
    return digest.hexdigest()


def complete_writes(docs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The write documents of `put_writes` calls that were stored whole.

    One call's writes go out in one unordered bulk write, which MongoDB does not apply
    atomically: a connection lost half-way can leave some of them stored. LangGraph takes
    any stored write of a task as that task having finished, so a partial batch would skip
    the task on resume and lose the rest of its output. Hiding incomplete batches makes
    LangGraph run the task again instead (and a retried call completes the batch).
    """
    counts: dict[tuple[Any, ...], int] = {}
    for doc in docs:
        if "batch" in doc:
            key = (doc["checkpoint_id"], doc["task_id"], doc["batch"])
            counts[key] = counts.get(key, 0) + 1
    return [
        doc for doc in docs
        if "batch" not in doc
        or counts[(doc["checkpoint_id"], doc["task_id"], doc["batch"])] >= doc["of"]
    ]


WRITE_IDENTITY = ("thread_id", "checkpoint_ns", "checkpoint_id", "task_path", "task_id", "idx")
"""The writes collection's unique key; also `writes_sort_key` order after the first three."""


def write_from_document(serde: SerializerProtocol, doc: Mapping[str, Any]) -> tuple[str, str, Any]:
    return (
        doc["task_id"],
        doc["channel"],
        load_typed(serde, doc["value"], f"write to {doc['channel']!r} of task {doc['task_id']!r}"),
    )
