"""Expiry by thread: a thread idle for long enough is deleted whole, never in part.

A MongoDB TTL index on checkpoints would delete documents one by one as each ages out,
which removes the *start* of a live thread's chain (and the value entries later
checkpoints point at). Instead, `expire_idle_threads` is a periodic job (the CLI's
expiry command, a cron job, a scheduled worker) that:

1. finds threads whose **newest** checkpoint is older than `now - idle`: candidate
   threads come from the `created_at` index (threads with at least one old checkpoint),
   then one `$group` per batch of candidates takes each one's newest `created_at`;
2. for each such thread, takes the thread's lease without waiting (a thread whose lease
   is held is in use: skipped), checks again under the lease that nothing newer
   arrived, and deletes its writes, its checkpoints (with the value entries they hold)
   and its lease document.

Runs that take the thread's lease (`saver.lease(thread_id)`) can never race with expiry.
A run that does not use leases and resumes a thread in the very moment it expires could
lose it; keep `idle` much longer than any pause between a thread's runs. Re-running the
job after a crash finishes what an interrupted deletion left (the thread is still idle).
Checkpoints without `created_at` (written by other tools) never expire.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pymongo import ASCENDING, IndexModel

from mongo_saver.documents import utcnow
from mongo_saver.errors import InvalidInputError
from mongo_saver.lease import LeaseState
from mongo_saver.ops import Aggregate, CreateIndexes, DeleteMany, NextBatch, OpenCursor, Plan

if TYPE_CHECKING:
    from mongo_saver.core import SaverCore

_BATCH = 400


def operations_indexes(core: SaverCore) -> Plan[None]:
    """Indexes the operations jobs need beyond `SaverCore.setup` (idempotent)."""
    yield CreateIndexes(core.checkpoints, [IndexModel([("created_at", ASCENDING)],
                                                      name="created_at")])


@dataclass(frozen=True, slots=True)
class ExpiredThread:
    thread_id: str
    newest: dt.datetime
    checkpoints_deleted: int = 0
    writes_deleted: int = 0


@dataclass
class ExpiryReport:
    cutoff: dt.datetime
    dry_run: bool
    expired: list[ExpiredThread] = field(default_factory=list)
    """Threads deleted (or, with `dry_run`, that would be)."""
    skipped_busy: list[str] = field(default_factory=list)
    """Idle threads whose lease was held: left alone this time."""
    skipped_active: list[str] = field(default_factory=list)
    """Threads that received a checkpoint between the scan and the deletion."""


def _newest(core: SaverCore, thread_ids: Sequence[str]) -> Plan[dict[str, dt.datetime]]:
    found = yield Aggregate(core.checkpoints, [
        {"$match": {"thread_id": {"$in": list(thread_ids)}}},
        {"$group": {"_id": "$thread_id", "newest": {"$max": "$created_at"}}},
    ])
    return {d["_id"]: d["newest"] for d in found if isinstance(d.get("newest"), dt.datetime)}


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def idle_threads(
    core: SaverCore, cutoff: dt.datetime, limit: int | None = None
) -> Plan[list[tuple[str, dt.datetime]]]:
    """Threads whose newest checkpoint was created before `cutoff`, oldest first."""
    cursor = yield OpenCursor(
        Aggregate(core.checkpoints, [
            {"$match": {"created_at": {"$lt": cutoff}}},
            {"$group": {"_id": "$thread_id"}},
        ]),
        _BATCH,
    )
    candidates: list[str] = []
    while batch := (yield NextBatch(cursor, _BATCH)):
        candidates.extend(d["_id"] for d in batch if isinstance(d["_id"], str))
    idle: list[tuple[str, dt.datetime]] = []
    for i in range(0, len(candidates), _BATCH):
        newest = yield from _newest(core, candidates[i : i + _BATCH])
        idle.extend((t, n) for t, n in newest.items() if _aware(n) < cutoff)
    idle.sort(key=lambda item: (_aware(item[1]), item[0]))
    return idle[:limit] if limit is not None else idle


def expire_idle_threads(
    core: SaverCore,
    lease_collection: str,
    idle: dt.timedelta,
    *,
    dry_run: bool = False,
    limit: int | None = None,
    now: dt.datetime | None = None,
) -> Plan[ExpiryReport]:
    """Delete, whole, every thread idle for at least `idle` (see the module docstring)."""
    if not isinstance(idle, dt.timedelta) or idle <= dt.timedelta(0):
        raise InvalidInputError(f"idle must be a positive timedelta, got {idle!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise InvalidInputError(f"limit must be None or a non-negative int, got {limit!r}")
    cutoff = (now or utcnow()) - idle
    report = ExpiryReport(cutoff=cutoff, dry_run=dry_run)
    for thread_id, newest in (yield from idle_threads(core, cutoff, limit)):
        if dry_run:
            report.expired.append(ExpiredThread(thread_id, newest))
            continue
        lease = LeaseState(lease_collection, thread_id, ttl=60.0, timeout=0)
        if not (yield from lease.try_acquire()):
            report.skipped_busy.append(thread_id)
            continue
        still = yield from _newest(core, [thread_id])
        if thread_id in still and _aware(still[thread_id]) >= cutoff:
            report.skipped_active.append(thread_id)
            yield from lease.release()
            continue
        core.cache.discard_thread(thread_id)
        writes = yield DeleteMany(core.writes, {"thread_id": thread_id})
        checkpoints = yield DeleteMany(core.checkpoints, {"thread_id": thread_id})
        yield DeleteMany(lease_collection, {"_id": thread_id, "holder": lease.holder})
        report.expired.append(ExpiredThread(thread_id, newest, checkpoints, writes))
    return report
