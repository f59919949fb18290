"""`AsyncMongoSaver`: the LangGraph checkpointer for asyncio clients.

Accepts pymongo's native `AsyncMongoClient` (preferred) and Motor's
`AsyncIOMotorClient` (past its end of life, still widely deployed). Every call is
native asyncio I/O; nothing runs in a thread pool.
"""

from __future__ import annotations

import asyncio
import builtins
import datetime as dt
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from pymongo import AsyncMongoClient

from mongo_saver.base import BaseMongoSaver
from mongo_saver.errors import MongoSaverError
from mongo_saver.expiry import ExpiryReport, expire_idle_threads, operations_indexes
from mongo_saver.integrity import DEFAULT_REPAIR_GRACE, IntegrityReport, check_integrity
from mongo_saver.lease import DEFAULT_TTL, AsyncLease
from mongo_saver.maintenance import MigrationReport, run_migration, version_status
from mongo_saver.runners import AsyncRunner

T = TypeVar("T")


class AsyncMongoSaver(BaseMongoSaver):
    """Stores LangGraph checkpoints in MongoDB through an asyncio client.

    The constructor does no I/O; `await setup()` once per deploy creates the indexes.
    The blocking methods work from other threads while the saver's event loop runs
    (as LangGraph's sync API does when it is handed an async saver), never from the
    loop itself.
    """

    def __init__(self, client: Any, db_name: str = "langgraph", **options: Any):
        super().__init__(client, db_name, **options)
        self._runner = AsyncRunner(self.database)
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls, uri: str, db_name: str = "langgraph", **options: Any
    ) -> AsyncIterator[AsyncMongoSaver]:
        """Open an `AsyncMongoClient` on `uri`, yield a saver owning it, close it after."""
        client: AsyncMongoClient[Any] = AsyncMongoClient(uri)
        saver = cls(client, db_name, **options)
        saver._owns_client = True
        try:
            yield saver
        finally:
            await saver.aclose()

    async def aclose(self) -> None:
        if self._owns_client:
            result = self.client.close()
            if asyncio.iscoroutine(result):
                await result

    async def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        self._loop = asyncio.get_running_loop()
        return await coro

    async def setup(self) -> None:
        await self._run(self._runner.run(self.core.setup()))
        await self._runner.run(operations_indexes(self.core))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._run(self._runner.run(self.core.get_tuple(config)))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        self._loop = asyncio.get_running_loop()
        plan = self.core.list_checkpoints(config, filter=filter, before=before, limit=limit)
        async for item in self._runner.stream(plan):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._guard_write(config)
        plan = self.core.put(config, checkpoint, metadata, new_versions)
        return await self._run(self._runner.run(plan))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._guard_write(config)
        plan = self.core.put_writes(config, writes, task_id, task_path)
        await self._run(self._runner.run(plan))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._run(self._runner.run(self.core.delete_thread(thread_id)))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._run(self._runner.run(self.core.delete_for_runs(run_ids)))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        plan = self.core.copy_thread(source_thread_id, target_thread_id)
        await self._run(self._runner.run(plan))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._run(self._runner.run(self.core.prune(thread_ids, strategy)))

    async def migration_status(self) -> builtins.list[dict[str, Any]]:
        """Documents per collection, storage format and schema version."""
        return await self._run(self._runner.run(version_status(self.core)))

    async def migrate(
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
        return await self._run(self._runner.run(plan))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await self._run(self._runner.run(self.core.delta_history(config, channels)))

    # --- operations ---------------------------------------------------------------------

    def lease(
        self, thread_id: str, ttl: float = DEFAULT_TTL, *, timeout: float | None = None
    ) -> AsyncLease:
        """A per-thread lease: `async with saver.lease(thread_id): await graph.ainvoke(...)`.

        See `MongoSaver.lease`; renewal runs as a task on the current event loop.
        """
        return AsyncLease(self._lease_state(thread_id, ttl, timeout), self._leases,
                          self._runner)

    async def check_integrity(
        self,
        thread_ids: Sequence[str] | None = None,
        repair: bool = False,
        *,
        repair_grace: dt.timedelta = DEFAULT_REPAIR_GRACE,
    ) -> IntegrityReport:
        """See `MongoSaver.check_integrity`."""
        plan = check_integrity(self.core, thread_ids, repair=repair, repair_grace=repair_grace)
        return await self._run(self._runner.run(plan))

    async def expire_idle_threads(
        self, idle: dt.timedelta, *, dry_run: bool = False, limit: int | None = None
    ) -> ExpiryReport:
        """See `MongoSaver.expire_idle_threads`."""
        plan = expire_idle_threads(self.core, self.lease_collection, idle, dry_run=dry_run,
                                   limit=limit)
        return await self._run(self._runner.run(plan))

    # --- the blocking API, bridged onto the saver's event loop ---------------------------

    def _bridge(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop or loop.is_closed():
            coro.close()
            raise MongoSaverError(
                "AsyncMongoSaver's blocking methods only work from another thread while its "
                "event loop runs; use the async methods (ainvoke, astream, aget_state)"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._bridge(self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before,
                                                limit=limit)]

        yield from self._bridge(collect())

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._bridge(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._bridge(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._bridge(self.adelete_thread(thread_id))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self._bridge(self.aget_delta_channel_history(config=config, channels=channels))
