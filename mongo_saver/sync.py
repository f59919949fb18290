"""`MongoSaver`: the LangGraph checkpointer for pymongo's blocking `MongoClient`."""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from pymongo import MongoClient

from mongo_saver.base import BaseMongoSaver
from mongo_saver.expiry import ExpiryReport, expire_idle_threads, operations_indexes
from mongo_saver.integrity import DEFAULT_REPAIR_GRACE, IntegrityReport, check_integrity
from mongo_saver.lease import DEFAULT_TTL, Lease
from mongo_saver.maintenance import MigrationReport, run_migration, version_status
from mongo_saver.runners import SyncRunner


class MongoSaver(BaseMongoSaver):
    """Stores LangGraph checkpoints in MongoDB through a blocking pymongo client.

    The constructor does no I/O; run `setup()` once per deploy to create the indexes.
    A client passed in stays the caller's: `close()` only closes a client this saver
    opened itself through `from_conn_string`.
    """

    def __init__(self, client: MongoClient[Any], db_name: str = "langgraph", **options: Any):
        super().__init__(client, db_name, **options)
        self._runner = SyncRunner(self.database)

    @classmethod
    @contextmanager
    def from_conn_string(
        cls, uri: str, db_name: str = "langgraph", **options: Any
    ) -> Iterator[MongoSaver]:
        """Open a client on `uri`, yield a saver that owns it, and close it afterwards."""
        client: MongoClient[Any] = MongoClient(uri)
        saver = cls(client, db_name, **options)
        saver._owns_client = True
        try:
            yield saver
        finally:
            saver.close()

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def setup(self) -> None:
        self._runner.run(self.core.setup())
        self._runner.run(operations_indexes(self.core))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._runner.run(self.core.get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        plan = self.core.list_checkpoints(config, filter=filter, before=before, limit=limit)
        yield from self._runner.stream(plan)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._guard_write(config)
        return self._runner.run(self.core.put(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._guard_write(config)
        self._runner.run(self.core.put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._runner.run(self.core.delete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._runner.run(self.core.delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._runner.run(self.core.copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._runner.run(self.core.prune(thread_ids, strategy))

    def migration_status(self) -> builtins.list[dict[str, Any]]:
        """Documents per collection, storage format and schema version."""
        return self._runner.run(version_status(self.core))

    def migrate(
        self,
        *,
        batch_size: int = 100,
        dry_run: bool = False,
        on_checkpoint: Callable[[], None] = lambda: None,
        on_thread: Callable[[str], None] = lambda _: None,
    ) -> MigrationReport:
        """Upgrade every outdated checkpoint now instead of on its next read; resumable."""
        plan = run_migration(self.core, batch_size=batch_size, dry_run=dry_run,
                             on_checkpoint=on_checkpoint, on_thread=on_thread)
        return self._runner.run(plan)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self._runner.run(self.core.delta_history(config, channels))

    # --- operations ---------------------------------------------------------------------

    def lease(
        self, thread_id: str, ttl: float = DEFAULT_TTL, *, timeout: float | None = None
    ) -> Lease:
        """A per-thread lease: `with saver.lease(thread_id): graph.invoke(...)`.

        Entering waits until no other run (in any process) holds the thread, or raises
        `LeaseError` after `timeout` seconds (None: wait as long as it takes). While it is
        held the lease renews itself every `ttl / 3`; if it is lost, this saver refuses
        checkpoint writes to the thread with `LeaseError`. See `mongo_saver.lease`.
        """
        return Lease(self._lease_state(thread_id, ttl, timeout), self._leases, self._runner)

    def check_integrity(
        self,
        thread_ids: Sequence[str] | None = None,
        repair: bool = False,
        *,
        repair_grace: dt.timedelta = DEFAULT_REPAIR_GRACE,
    ) -> IntegrityReport:
        """Report holes, orphan writes, missing values and unknown versions; see
        `mongo_saver.integrity`. `repair=True` deletes orphan writes older than
        `repair_grace`, nothing else."""
        return self._runner.run(
            check_integrity(self.core, thread_ids, repair=repair, repair_grace=repair_grace)
        )

    def expire_idle_threads(
        self, idle: dt.timedelta, *, dry_run: bool = False, limit: int | None = None
    ) -> ExpiryReport:
        """Delete, whole, each thread whose newest checkpoint is older than `idle`."""
        return self._runner.run(
            expire_idle_threads(self.core, self.lease_collection, idle, dry_run=dry_run,
                                limit=limit)
        )
