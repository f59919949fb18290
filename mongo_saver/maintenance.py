"""Eager migration and version status, for teams that do not want to wait for reads.

Lazy migration upgrades a checkpoint the first time it is read. `migrate_threads` does the
same work ahead of time, thread by thread, in `thread_id` order: it selects only documents
still below the current format or schema version, so after a crash it simply continues
where it stopped, and a dry run reads and migrates in memory without writing anything.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mongo_saver.core import SaverCore
from mongo_saver.documents import FORMAT_VERSION
from mongo_saver.errors import MongoSaverError
from mongo_saver.ops import Aggregate, Emit, Plan, R


@dataclass
class MigrationReport:
    threads: int = 0
    checkpoints: int = 0
    failures: list[str] = field(default_factory=list)
    dry_run: bool = False


def _outdated(core: SaverCore) -> dict[str, Any]:
    return {"$or": [
        {"format": {"$exists": False}},
        {"format": {"$lt": FORMAT_VERSION}},
        {"schema_version": {"$lt": core.upgrader.current_schema_version}},
    ]}


def version_status(core: SaverCore) -> Plan[list[dict[str, Any]]]:
    """Documents per collection, storage format and schema version (format 0 = legacy)."""
    rows: list[dict[str, Any]] = []
    for collection in (core.checkpoints, core.writes):
        found = yield Aggregate(collection, [
            {"$group": {
                "_id": {"format": {"$ifNull": ["$format", 0]},
                        "schema_version": {"$ifNull": ["$schema_version", 1]}},
                "documents": {"$sum": 1},
            }},
            {"$sort": {"_id.format": 1, "_id.schema_version": 1}},
        ])
        rows += [
            {"collection": collection, **doc["_id"], "documents": doc["documents"]}
            for doc in found
        ]
    return rows


def outdated_threads(core: SaverCore, after: str | None, limit: int) -> Plan[list[str]]:
    """The next `limit` thread ids, in order after `after`, that hold outdated checkpoints."""
    match: dict[str, Any] = _outdated(core)
    if after is not None:
        match = {"$and": [match, {"thread_id": {"$gt": after}}]}
    found = yield Aggregate(core.checkpoints, [
        {"$match": match},
        {"$group": {"_id": "$thread_id"}},
        {"$sort": {"_id": 1}},
        {"$limit": limit},
    ])
    return [doc["_id"] for doc in found]


def forward(plan: Plan[R], on_item: Callable[[Any], None]) -> Plan[R]:
    """Run a sub-plan inside this one, handing each item it emits to `on_item`."""
    result: Any = None
    while True:
        try:
            op = plan.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        if isinstance(op, Emit):
            on_item(op.item)
            result = None
        else:
            result = yield op


def migrate_thread(
    core: SaverCore, thread_id: str, on_checkpoint: Callable[[], None]
) -> Plan[None]:
    """Read every checkpoint of a thread once: the read path upgrades and writes back."""
    if core.upgrader.write_back:
        yield from core.convert_legacy_thread(thread_id)
    plan = core.list_checkpoints({"configurable": {"thread_id": thread_id}})
    yield from forward(plan, lambda _: on_checkpoint())


def run_migration(
    core: SaverCore,
    *,
    batch_size: int,
    dry_run: bool = False,
    on_checkpoint: Callable[[], None] = lambda: None,
    on_thread: Callable[[str], None] = lambda _: None,
) -> Plan[MigrationReport]:
    """Migrate every outdated thread, `batch_size` thread ids per query.

    With write-back off (a dry run) nothing is written: every checkpoint is read and
    migrated in memory, so a step that would fail is reported before any deploy.
    """
    if dry_run:
        core = copy.copy(core)
        core.upgrader = copy.copy(core.upgrader)
        core.upgrader.write_back = False
    report = MigrationReport(dry_run=not core.upgrader.write_back)

    def counted() -> None:
        report.checkpoints += 1
        on_checkpoint()

    after: str | None = None
    while threads := (yield from outdated_threads(core, after, batch_size)):
        for thread_id in threads:
            on_thread(thread_id)
            try:
                yield from migrate_thread(core, thread_id, counted)
            except MongoSaverError as error:
                report.failures.append(f"{thread_id}: {error}")
            report.threads += 1
        after = threads[-1]
    return report
