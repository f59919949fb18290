"""Read-only summaries of stored threads, for the CLI and for operators' own scripts.

Pure functions only: each `*_pipeline` builds an aggregation (or `*_query` a find filter)
to run on the checkpoints or writes collection, and the other functions turn decoded
checkpoints or query results into plain dicts and rows. Nothing here does I/O, so the same
summaries serve a blocking or an asyncio client and are easy to test.

Documents written by older storage layouts (including `langgraph-checkpoint-mongodb`'s)
lack `format`, `schema_version`, `size` or `created_at`; the pipelines fall back to
`null`, the document's BSON size and nothing respectively, so they never fail on them.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import Checkpoint, CheckpointTuple

Document = dict[str, Any]

SIZE_EXPR: Document = {"$ifNull": ["$size", {"$bsonSize": "$$ROOT"}]}
"""A checkpoint document's stored size: the saver's `size` field, else measured."""

INTERNAL_PREFIXES = ("branch:to:", "join:", "split:", "__")
"""Channels LangGraph uses for control flow rather than state."""


def is_internal_channel(channel: str) -> bool:
    return channel.startswith(INTERNAL_PREFIXES)


# --- threads -------------------------------------------------------------------------------


def threads_pipeline(
    limit: int, thread_prefix: str | None = None, largest: bool = False
) -> list[Document]:
    """One row per thread, most recently active (or, with `largest`, biggest) first."""
    pipeline: list[Document] = []
    if thread_prefix:
        pipeline.append({"$match": {"thread_id": {"$regex": "^" + _regex_escape(thread_prefix)}}})
    pipeline += [
        {"$group": {
            "_id": "$thread_id",
            "checkpoints": {"$sum": 1},
            "size": {"$sum": SIZE_EXPR},
            "schema_versions": {"$addToSet": {"$ifNull": ["$schema_version", None]}},
            "formats": {"$addToSet": {"$ifNull": ["$format", None]}},
            "namespaces": {"$addToSet": "$checkpoint_ns"},
            "last_activity": {"$max": "$created_at"},
            "latest_checkpoint_id": {"$max": "$checkpoint_id"},
        }},
        # checkpoint ids are time-ordered, so they break ties and cover legacy documents
        {"$sort": {"size": -1, "latest_checkpoint_id": -1} if largest
         else {"last_activity": -1, "latest_checkpoint_id": -1}},
        {"$limit": int(limit)},
    ]
    return pipeline


def thread_writes_pipeline(thread_ids: Sequence[str]) -> list[Document]:
    """Pending-write counts of the given threads (writes collection)."""
    return [
        {"$match": {"thread_id": {"$in": list(thread_ids)}}},
        {"$group": {"_id": "$thread_id", "writes": {"$sum": 1}}},
    ]


def thread_rows(
    groups: Iterable[Mapping[str, Any]], write_counts: Iterable[Mapping[str, Any]] = ()
) -> list[Document]:
    """Turn `threads_pipeline` and `thread_writes_pipeline` results into plain rows."""
    writes = {w["_id"]: int(w["writes"]) for w in write_counts}
    rows = []
    for group in groups:
        rows.append({
            "thread_id": group["_id"],
            "checkpoints": int(group["checkpoints"]),
            "writes": writes.get(group["_id"], 0),
            "size_bytes": int(group.get("size") or 0),
            "schema_versions": _sorted_versions(group.get("schema_versions", [])),
            "formats": _sorted_versions(group.get("formats", [])),
            "namespaces": sorted(group.get("namespaces") or []),
            "last_activity": iso(group.get("last_activity")),
            "latest_checkpoint_id": group.get("latest_checkpoint_id"),
        })
    return rows


# --- database-wide statistics ----------------------------------------------------------


def checkpoint_versions_pipeline() -> list[Document]:
    """Checkpoint documents and bytes per (format, schema_version)."""
    return [
        {"$group": {
            "_id": {"format": {"$ifNull": ["$format", None]},
                    "schema_version": {"$ifNull": ["$schema_version", None]}},
            "documents": {"$sum": 1},
            "size": {"$sum": SIZE_EXPR},
            "largest": {"$max": SIZE_EXPR},
            "threads": {"$addToSet": "$thread_id"},
        }},
        {"$project": {"documents": 1, "size": 1, "largest": 1,
                      "threads": {"$size": "$threads"}}},
    ]


def write_versions_pipeline() -> list[Document]:
    """Pending-write documents per (format, schema_version)."""
    return [
        {"$group": {
            "_id": {"format": {"$ifNull": ["$format", None]},
                    "schema_version": {"$ifNull": ["$schema_version", None]}},
            "documents": {"$sum": 1},
        }},
    ]


def thread_count_pipeline() -> list[Document]:
    return [{"$group": {"_id": "$thread_id"}}, {"$count": "threads"}]


def value_kinds_pipeline() -> list[Document]:
    """Stored value entries per kind (full copy, append link, empty) with payload bytes."""
    return [
        {"$match": {"values.0": {"$exists": True}}},
        {"$project": {"values.kind": 1, "values.d": 1}},
        {"$unwind": "$values"},
        {"$group": {
            "_id": {"$ifNull": ["$values.kind", "full"]},
            "entries": {"$sum": 1},
            "bytes": {"$sum": {"$binarySize": {"$ifNull": ["$values.d", ""]}}},
        }},
    ]


def stats_summary(
    checkpoint_groups: Iterable[Mapping[str, Any]],
    write_groups: Iterable[Mapping[str, Any]],
    thread_count: Iterable[Mapping[str, Any]],
    value_kinds: Iterable[Mapping[str, Any]],
) -> Document:
    """Combine the four statistics queries into one plain dict."""
    by_version = sorted(
        (
            {
                "format": g["_id"].get("format"),
                "schema_version": g["_id"].get("schema_version"),
                "checkpoints": int(g["documents"]),
                "threads": int(g.get("threads") or 0),
                "size_bytes": int(g.get("size") or 0),
                "largest_bytes": int(g.get("largest") or 0),
            }
            for g in checkpoint_groups
        ),
        key=lambda r: (_version_key(r["format"]), _version_key(r["schema_version"])),
    )
    writes = sorted(
        (
            {"format": g["_id"].get("format"), "schema_version": g["_id"].get("schema_version"),
             "writes": int(g["documents"])}
            for g in write_groups
        ),
        key=lambda r: (_version_key(r["format"]), _version_key(r["schema_version"])),
    )
    kinds = sorted(
        ({"kind": k["_id"], "entries": int(k["entries"]), "bytes": int(k["bytes"])}
         for k in value_kinds),
        key=lambda r: str(r["kind"]),
    )
    counts = list(thread_count)
    checkpoints = sum(r["checkpoints"] for r in by_version)
    size = sum(r["size_bytes"] for r in by_version)
    return {
        "threads": int(counts[0]["threads"]) if counts else 0,
        "checkpoints": checkpoints,
        "writes": sum(r["writes"] for r in writes),
        "size_bytes": size,
        "average_checkpoint_bytes": round(size / checkpoints) if checkpoints else 0,
        "largest_checkpoint_bytes": max((r["largest_bytes"] for r in by_version), default=0),
        "checkpoints_by_version": by_version,
        "writes_by_version": writes,
        "value_entries": kinds,
    }


# --- one thread -----------------------------------------------------------------------


def checkpoint_facts_query(
    thread_id: str, checkpoint_ns: str, checkpoint_ids: Sequence[str]
) -> tuple[Document, Document]:
    """Filter and projection for the stored facts the decoded tuples do not carry."""
    return (
        {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
         "checkpoint_id": {"$in": list(checkpoint_ids)}},
        {"_id": 0, "checkpoint_id": 1, "size": 1, "created_at": 1, "format": 1,
         "schema_version": 1},
    )


def checkpoint_facts(docs: Iterable[Mapping[str, Any]]) -> dict[str, Document]:
    """Stored size, creation time and versions per checkpoint id."""
    return {
        d["checkpoint_id"]: {
            "size_bytes": d.get("size"),
            "created_at": iso(d.get("created_at")),
            "format": d.get("format"),
            "schema_version": d.get("schema_version"),
        }
        for d in docs
    }


def prefix_query(thread_id: str, checkpoint_ns: str, prefix: str) -> Document:
    """Checkpoints of a thread whose id starts with `prefix` (ids may be abbreviated)."""
    return {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": {"$regex": "^" + _regex_escape(prefix)}}


def task_nodes_query(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> Document:
    return {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id}


def task_nodes(write_docs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Map task ids to node names, from the `task_path` LangGraph gives pending writes."""
    nodes = {}
    for doc in write_docs:
        path = str(doc.get("task_path") or "")
        parts = [p.strip() for p in path.split(",")]
        if len(parts) >= 2 and parts[0] == "~__pregel_pull":
            nodes[doc["task_id"]] = parts[1]
        elif len(parts) >= 2 and parts[0] == "~__pregel_push":
            nodes.setdefault(doc["task_id"], "(send)")
    return nodes


def _version_greater(a: Any, b: Any) -> bool:
    if b is None:
        return True
    try:
        return bool(a > b)
    except TypeError:
        return str(a) > str(b)


def next_nodes(checkpoint: Checkpoint) -> list[str]:
    """Nodes the stored checkpoint would trigger, derived without the graph.

    LangGraph computes `next` from the compiled graph; from the stored data alone we can
    read which trigger channels (`__start__`, `branch:to:NODE`) hold a value newer than
    what that node has seen, plus the targets of pending `Send`s. Joins and custom
    triggers are not covered, so this is a good guide rather than the authority.
    """
    values = checkpoint.get("channel_values", {})
    versions = checkpoint.get("channel_versions", {})
    seen = checkpoint.get("versions_seen", {})
    found: list[str] = []
    for channel, version in versions.items():
        if channel not in values:
            continue
        if channel == "__start__":
            node = "__start__"
        elif channel.startswith("branch:to:"):
            node = channel[len("branch:to:"):]
        else:
            continue
        if _version_greater(version, seen.get(node, {}).get(channel)):
            found.append(node)
    for task in values.get("__pregel_tasks", None) or []:
        target = getattr(task, "node", None)
        if isinstance(target, str):
            found.append(target)
    return sorted(set(found))


def changed_channels(checkpoint: Checkpoint, parent: Checkpoint | None) -> list[str]:
    """State channels this checkpoint changed: `updated_channels`, else versions vs parent."""
    updated = checkpoint.get("updated_channels")
    if updated is None:
        before = parent["channel_versions"] if parent else {}
        updated = [
            ch for ch, v in checkpoint.get("channel_versions", {}).items() if before.get(ch) != v
        ]
    return sorted(ch for ch in updated if not is_internal_channel(ch))


def history_rows(
    tuples: Sequence[CheckpointTuple],
    facts: Mapping[str, Mapping[str, Any]],
) -> list[Document]:
    """One row per checkpoint, newest first, for `history`."""
    by_id = {t.checkpoint["id"]: t for t in tuples}
    rows = []
    for t in tuples:
        metadata: Mapping[str, Any] = t.metadata or {}
        parent_id = t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
        parent = by_id.get(parent_id) if parent_id else None
        stored = facts.get(t.checkpoint["id"], {})
        errors = [w for w in t.pending_writes or [] if w[1] == "__error__"]
        rows.append({
            "checkpoint_id": t.checkpoint["id"],
            "parent_checkpoint_id": parent_id,
            "step": metadata.get("step"),
            "source": metadata.get("source"),
            "next": next_nodes(t.checkpoint),
            "changed": changed_channels(t.checkpoint, parent.checkpoint if parent else None),
            "pending_writes": len(t.pending_writes or []),
            "errors": len(errors),
            "size_bytes": stored.get("size_bytes"),
            "schema_version": stored.get("schema_version"),
            "created_at": stored.get("created_at") or t.checkpoint.get("ts"),
        })
    return rows


def state_view(
    t: CheckpointTuple,
    *,
    include_internal: bool = False,
    nodes: Mapping[str, str] | None = None,
    facts: Mapping[str, Any] | None = None,
) -> Document:
    """A checkpoint as plain JSON-able data: channel values, pending writes, metadata."""
    values = {
        ch: to_jsonable(v)
        for ch, v in sorted(t.checkpoint.get("channel_values", {}).items())
        if include_internal or not is_internal_channel(ch)
    }
    nodes = nodes or {}
    return {
        "thread_id": t.config["configurable"]["thread_id"],
        "checkpoint_ns": t.config["configurable"].get("checkpoint_ns", ""),
        "checkpoint_id": t.checkpoint["id"],
        "parent_checkpoint_id": (
            t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
        ),
        "ts": t.checkpoint.get("ts"),
        **(dict(facts) if facts else {}),
        "metadata": to_jsonable(t.metadata),
        "next": next_nodes(t.checkpoint),
        "values": values,
        "pending_writes": [
            {"task_id": task_id, "node": nodes.get(task_id), "channel": channel,
             "value": to_jsonable(value)}
            for task_id, channel, value in t.pending_writes or []
        ],
    }


# --- diff ---------------------------------------------------------------------------------


def diff_values(
    a: Mapping[str, Any], b: Mapping[str, Any], *, include_internal: bool = False
) -> list[Document]:
    """Channel-by-channel difference from state `a` to state `b` (JSON-able values)."""
    rows = []
    for channel in sorted(set(a) | set(b)):
        if not include_internal and is_internal_channel(channel):
            continue
        if channel not in a:
            rows.append({"channel": channel, "change": "added", "after": b[channel]})
        elif channel not in b:
            rows.append({"channel": channel, "change": "removed", "before": a[channel]})
        elif a[channel] == b[channel]:
            rows.append({"channel": channel, "change": "unchanged"})
        else:
            rows.append({"channel": channel, **_describe_change(a[channel], b[channel])})
    return rows


def _describe_change(old: Any, new: Any) -> Document:
    if isinstance(old, list) and isinstance(new, list):
        common = 0
        for x, y in zip(old, new, strict=False):
            if x != y:
                break
            common += 1
        if common == len(old):
            return {"change": "appended", "count": len(new) - common, "items": new[common:]}
        if common == len(new):
            return {"change": "truncated", "count": len(old) - common, "items": old[common:]}
        return {
            "change": "changed",
            "detail": f"list of {len(old)} -> {len(new)} items: first {common} kept, "
                      f"{len(old) - common} replaced by {len(new) - common}",
            "removed": old[common:],
            "added": new[common:],
        }
    if isinstance(old, dict) and isinstance(new, dict):
        added = sorted(k for k in new if k not in old)
        removed = sorted(k for k in old if k not in new)
        changed = sorted(k for k in new if k in old and new[k] != old[k])
        parts = [f"{label}: {', '.join(map(str, keys))}" for label, keys in
                 (("added keys", added), ("removed keys", removed), ("changed keys", changed))
                 if keys]
        return {"change": "changed", "detail": "; ".join(parts), "before": old, "after": new}
    return {"change": "changed", "before": old, "after": new}


# --- plain data -----------------------------------------------------------------------


def to_jsonable(value: Any, _depth: int = 0) -> Any:
    """Best-effort conversion of a channel value to JSON-compatible data.

    Pydantic models (LangChain messages among them) keep their non-default fields and their
    `type`; dataclasses become dicts; bytes become base64; anything else its `repr`.
    """
    if _depth > 50:
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [to_jsonable(v, _depth + 1) for v in items]
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return {"$base64": base64.b64encode(bytes(value)).decode()}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        data = dump(exclude_defaults=True)
        type_ = getattr(value, "type", None)
        if isinstance(type_, str) and isinstance(data, dict):
            data = {"type": type_, **data}
        return to_jsonable(data, _depth + 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value), _depth + 1)
    if hasattr(value, "node") and hasattr(value, "arg"):  # langgraph.types.Send
        return {"send": value.node, "arg": to_jsonable(value.arg, _depth + 1)}
    return repr(value)


def iso(value: Any) -> str | None:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        text: str = value.isoformat(timespec="seconds")
        return text
    return None if value is None else str(value)


def _version_key(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int) else (1, str(value))


def _sorted_versions(values: Iterable[Any]) -> list[Any]:
    return sorted(values, key=_version_key)


def _regex_escape(text: str) -> str:
    return re.escape(text)
