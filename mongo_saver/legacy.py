"""Reading collections written by `langgraph-checkpoint-mongodb` (storage format 0).

Its layout, which `docs/legacy-formats.md` documents:

* checkpoints: `{thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type,
  checkpoint, metadata[, created_at]}` where `checkpoint` is the whole `Checkpoint`,
  channel values included, serialized by the saver's serializer as `(type, bytes)`;
* metadata, since 0.2.2: the same keys with every leaf stored as a serializer-typed pair
  `[type, bytes]`; before that: the metadata as raw JSON bytes;
* writes: `{thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel,
  type, value}` with `value` the serialized bytes.

A format-0 document is converted in memory into the current layout (every channel value
becomes a full value entry inside it) and, when write-back is on, replaced in place the
first time it is read. It has no `schema_version`; it is taken to be at version 1, the
application's first schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import bson
from langgraph.checkpoint.serde.base import SerializerProtocol

from mongo_saver import documents as docs_
from mongo_saver.errors import CorruptDocumentError

LEGACY_FORMAT = 0
LEGACY_SCHEMA_VERSION = 1


def is_legacy(doc: Mapping[str, Any]) -> bool:
    return "format" not in doc and "type" in doc and "checkpoint" in doc


def is_legacy_write(doc: Mapping[str, Any]) -> bool:
    return "format" not in doc and "type" in doc


def legacy_metadata(serde: SerializerProtocol, value: Any) -> Any:
    """Decode either legacy metadata encoding into plain Python values."""
    if isinstance(value, (bytes, str)):
        return json.loads(value)
    if isinstance(value, Mapping):
        return {k: legacy_metadata(serde, v) for k, v in value.items()}
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], bytes)
    ):
        return serde.loads_typed((value[0], value[1]))
    return value


def legacy_filter_value(serde: SerializerProtocol, value: Any) -> list[Any]:
    """How a metadata filter value is stored by the incumbent (typed pair)."""
    type_, data = serde.dumps_typed(value)
    return [type_, data]


def convert_checkpoint(serde: SerializerProtocol, doc: Mapping[str, Any]) -> dict[str, Any]:
    """A format-0 checkpoint document in the current layout (pure; nothing is written)."""
    where = f"legacy checkpoint {doc.get('checkpoint_id')} of thread {doc.get('thread_id')!r}"
    try:
        checkpoint = serde.loads_typed((doc["type"], bytes(doc["checkpoint"])))
        metadata = legacy_metadata(serde, doc.get("metadata") or {})
    except Exception as exc:
        raise CorruptDocumentError(f"cannot decode {where}: {exc}") from exc
    versions = checkpoint.get("channel_versions", {})
    entries = []
    for channel, value in checkpoint.get("channel_values", {}).items():
        if channel not in versions:
            continue  # LangGraph drops values without a version on the next step, too
        version = versions[channel]
        entries.append(
            {
                "k": docs_.blob_key(channel, version),
                "c": channel,
                "sv": LEGACY_SCHEMA_VERSION,
                "kind": "full",
                **docs_.dump_typed(serde, value, f"channel {channel!r} of {where}"),
            }
        )
    converted: dict[str, Any] = {
        "_id": doc.get("_id"),
        "thread_id": doc["thread_id"],
        "checkpoint_ns": doc.get("checkpoint_ns", ""),
        "checkpoint_id": doc["checkpoint_id"],
        "parent_checkpoint_id": doc.get("parent_checkpoint_id"),
        "format": docs_.FORMAT_VERSION,
        "schema_version": LEGACY_SCHEMA_VERSION,
        "created_at": doc.get("created_at") or docs_.utcnow(),
        "checkpoint": docs_.checkpoint_header(serde, checkpoint),
        "metadata": docs_.metadata_to_bson(serde, metadata),
        "values": entries,
        "blob_keys": [],  # a legacy checkpoint holds every value it needs itself
        "empty": [ch for ch in versions if ch not in checkpoint.get("channel_values", {})],
    }
    converted["size"] = len(bson.encode(converted))
    return converted


def convert_write(serde: SerializerProtocol, doc: Mapping[str, Any]) -> dict[str, Any]:
    """A format-0 write document in the current layout."""
    return {
        **{k: v for k, v in doc.items() if k not in ("type", "value")},
        "value": {"t": doc["type"], "d": bytes(doc["value"])},
        "format": docs_.FORMAT_VERSION,
        "schema_version": LEGACY_SCHEMA_VERSION,
    }
