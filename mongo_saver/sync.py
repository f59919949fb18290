"""`MongoSaver`: the LangGraph checkpointer for pymongo's blocking `MongoClient`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
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
        plan = self.core.list(config, filter=filter, before=before, limit=limit)
        yield from self._runner.stream(plan)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._runner.run(self.core.put(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._runner.run(self.core.put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._runner.run(self.core.delete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._runner.run(self.core.delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._runner.run(self.core.copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._runner.run(self.core.prune(thread_ids, strategy))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self._runner.run(self.core.delta_history(config, channels))
