"""Integrity check: walk threads and report what a reader would trip over, loudly.

`check_integrity` is a plan (see `mongo_saver.ops`) that reads each thread's checkpoint
skeletons and pending writes and reports:

* **dangling parents**: a checkpoint whose `parent_checkpoint_id` names no checkpoint of
  its thread and namespace (a hole in the parent chain);
* **orphan writes**: pending writes whose checkpoint does not exist;
* **missing values**: a value key a checkpoint needs (one per entry of its
  `channel_versions`, every key of its `blob_keys`, and the `prev` link of any append
  entry) that no document of the thread and namespace holds;
* **unknown versions**: documents whose `format` or `schema_version` this code does not
  know (missing, not an integer, or newer than the code);
* **forks**: a checkpoint with more than one child, or a namespace with more than one
  root. Time travel (`update_state` on an old checkpoint) forks legitimately, so forks
  do not make a report unclean; two runs racing on one thread without a lease show up
  here.

Nothing is changed unless `repair=True`, and then only orphan writes older than a grace
period are deleted: they can never be read (their checkpoint is gone), and the grace
period keeps a write whose checkpoint is still being saved out of reach.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from mongo_saver import documents as docs_
from mongo_saver.documents import require_id, utcnow
from mongo_saver.ops import Aggregate, DeleteMany, Document, Find, NextBatch, OpenCursor, Plan

if TYPE_CHECKING:
    from mongo_saver.core import SaverCore

BATCH = 500
_IN_CHUNK = 400
DEFAULT_REPAIR_GRACE = dt.timedelta(minutes=5)

Kind = Literal["dangling_parent", "orphan_write", "missing_value", "unknown_version", "fork"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem (or, for `fork`, one notable shape) found in one thread."""

    kind: Kind
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str | None
    detail: str

    def __str__(self) -> str:
        where = f"thread {self.thread_id!r} ns {self.checkpoint_ns!r}"
        if self.checkpoint_id is not None:
            where += f" checkpoint {self.checkpoint_id}"
        return f"{self.kind}: {where}: {self.detail}"


@dataclass
class IntegrityReport:
    threads_checked: int = 0
    checkpoints_checked: int = 0
    writes_checked: int = 0
    findings: list[Finding] = field(default_factory=list)
    repaired: list[Finding] = field(default_factory=list)
    """Orphan writes deleted by `repair=True`."""

    def of(self, kind: Kind) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    @property
    def dangling_parents(self) -> list[Finding]:
        return self.of("dangling_parent")

    @property
    def orphan_writes(self) -> list[Finding]:
        return self.of("orphan_write")

    @property
    def missing_values(self) -> list[Finding]:
        return self.of("missing_value")

    @property
    def unknown_versions(self) -> list[Finding]:
        return self.of("unknown_version")

    @property
    def forks(self) -> list[Finding]:
        return self.of("fork")

    @property
    def clean(self) -> bool:
        """No hole, no missing value, no unknown version, no orphan write left behind."""
        repaired = set(self.repaired)
        return not any(
            f.kind != "fork" and f not in repaired for f in self.findings
        )

    @property
    def linear(self) -> bool:
        """Clean, and every namespace's history is a single chain."""
        return self.clean and not self.forks

    def summary(self) -> str:
        counts: dict[str, int] = defaultdict(int)
        for f in self.findings:
            counts[f.kind] += 1
        parts = [f"{n} {kind}" for kind, n in sorted(counts.items())] or ["no findings"]
        return (
            f"{self.threads_checked} threads, {self.checkpoints_checked} checkpoints, "
            f"{self.writes_checked} writes checked: {', '.join(parts)}"
            + (f"; repaired {len(self.repaired)} orphan writes" if self.repaired else "")
        )


def _version_problem(doc: Document, current_schema: int) -> str | None:
    fmt, schema = doc.get("format"), doc.get("schema_version")
    if not isinstance(fmt, int) or isinstance(fmt, bool) or not 1 <= fmt <= docs_.FORMAT_VERSION:
        return f"format {fmt!r} (this code knows 1..{docs_.FORMAT_VERSION})"
    if (
        not isinstance(schema, int)
        or isinstance(schema, bool)
        or not 0 <= schema <= current_schema
    ):
        return f"schema_version {schema!r} (this code knows up to {current_schema})"
    return None


class _Namespace:
    """What one thread+namespace holds and needs, accumulated from its skeletons."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.parents: dict[str, str | None] = {}
        self.held: set[str] = set()
        self.needed: dict[str, str] = {}  # key -> first checkpoint id that needs it

    def add(self, doc: Document) -> None:
        checkpoint_id = doc["checkpoint_id"]
        self.ids.add(checkpoint_id)
        self.parents[checkpoint_id] = doc.get("parent_checkpoint_id")
        for entry in doc.get("values") or []:
            key = entry.get("k")
            if isinstance(key, str):
                self.held.add(key)
            if entry.get("kind") == "append" and isinstance(entry.get("prev"), str):
                self.needed.setdefault(entry["prev"], checkpoint_id)
        for key in docs_.head_keys(doc).values():
            self.needed.setdefault(key, checkpoint_id)
        for key in doc.get("blob_keys") or []:
            self.needed.setdefault(key, checkpoint_id)


def _thread_findings(thread_id: str, spaces: dict[str, _Namespace]) -> Iterable[Finding]:
    for ns, space in sorted(spaces.items()):
        children: dict[str | None, list[str]] = defaultdict(list)
        for checkpoint_id, parent in sorted(space.parents.items()):
            children[parent].append(checkpoint_id)
            if parent is not None and parent not in space.ids:
                yield Finding("dangling_parent", thread_id, ns, checkpoint_id,
                              f"parent {parent} does not exist")
        for key in sorted(space.needed.keys() - space.held):
            yield Finding("missing_value", thread_id, ns, space.needed[key],
                          f"needs value {key!r}, which no document of the thread holds")
        for parent, kids in sorted(children.items(), key=lambda kv: kv[0] or ""):
            if len(kids) > 1:
                what = "root checkpoints" if parent is None else f"children of {parent}"
                yield Finding("fork", thread_id, ns, parent,
                              f"{len(kids)} {what}: {', '.join(kids)}")


def _thread_ids(core: SaverCore) -> Plan[list[str]]:
    found: set[str] = set()
    for collection in (core.checkpoints, core.writes):
        cursor = yield OpenCursor(Aggregate(collection, [{"$group": {"_id": "$thread_id"}}]),
                                  BATCH)
        while batch := (yield NextBatch(cursor, BATCH)):
            found.update(d["_id"] for d in batch if isinstance(d["_id"], str))
    return sorted(found)


def check_integrity(
    core: SaverCore,
    thread_ids: Sequence[str] | None = None,
    *,
    repair: bool = False,
    repair_grace: dt.timedelta = DEFAULT_REPAIR_GRACE,
) -> Plan[IntegrityReport]:
    """Check the given threads (default: every thread); see the module docstring."""
    if thread_ids is not None:
        if isinstance(thread_ids, str):
            thread_ids = [thread_ids]
        threads = [require_id("thread_id", t) for t in thread_ids]
    else:
        threads = yield from _thread_ids(core)
    current_schema = core.upgrader.current_schema_version
    repair_before = utcnow() - repair_grace
    report = IntegrityReport()
    for thread_id in threads:
        report.threads_checked += 1
        spaces: dict[str, _Namespace] = defaultdict(_Namespace)
        cursor = yield OpenCursor(
            Find(core.checkpoints, {"thread_id": thread_id},
                 projection={"_id": 0, "checkpoint_ns": 1, "checkpoint_id": 1,
                             "parent_checkpoint_id": 1, "format": 1, "schema_version": 1,
                             "checkpoint.channel_versions": 1, "blob_keys": 1,
                             "heads": 1, "empty": 1,
                             "values.k": 1, "values.kind": 1, "values.prev": 1}),
            BATCH,
        )
        while batch := (yield NextBatch(cursor, BATCH)):
            for doc in batch:
                report.checkpoints_checked += 1
                ns = doc.get("checkpoint_ns", "")
                spaces[ns].add(doc)
                problem = _version_problem(doc, current_schema)
                if problem:
                    report.findings.append(Finding("unknown_version", thread_id, ns,
                                                   doc.get("checkpoint_id"),
                                                   f"checkpoint has {problem}"))
        report.findings.extend(_thread_findings(thread_id, spaces))
        doomed: list[Any] = []
        cursor = yield OpenCursor(
            Find(core.writes, {"thread_id": thread_id},
                 projection={"_id": 1, "checkpoint_ns": 1, "checkpoint_id": 1, "task_id": 1,
                             "channel": 1, "idx": 1, "format": 1, "schema_version": 1,
                             "created_at": 1}),
            BATCH,
        )
        while batch := (yield NextBatch(cursor, BATCH)):
            for write in batch:
                report.writes_checked += 1
                ns = write.get("checkpoint_ns", "")
                checkpoint_id = write.get("checkpoint_id")
                what = (f"write to {write.get('channel')!r} by task {write.get('task_id')!r} "
                        f"(idx {write.get('idx')})")
                problem = _version_problem(write, current_schema)
                if problem:
                    report.findings.append(Finding("unknown_version", thread_id, ns,
                                                   checkpoint_id, f"{what} has {problem}"))
                if ns in spaces and checkpoint_id in spaces[ns].ids:
                    continue
                finding = Finding("orphan_write", thread_id, ns, checkpoint_id,
                                  f"{what}: its checkpoint does not exist")
                report.findings.append(finding)
                created = write.get("created_at")
                if repair and isinstance(created, dt.datetime):
                    if created.tzinfo is None:
                        created = created.replace(tzinfo=dt.UTC)
                    if created <= repair_before:
                        doomed.append(write["_id"])
                        report.repaired.append(finding)
        for i in range(0, len(doomed), _IN_CHUNK):
            yield DeleteMany(core.writes, {"_id": {"$in": doomed[i : i + _IN_CHUNK]}})
    return report
