"""What `MongoSaver` and `AsyncMongoSaver` share: options, the core, version numbers."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pymongo import ReadPreference, WriteConcern
from pymongo.read_preferences import _ServerMode

from mongo_saver.core import SaverCore, next_version
from mongo_saver.lease import LEASE_COLLECTION, LeaseRegistry, LeaseState
from mongo_saver.migrations import SchemaMigrations
from mongo_saver.values import DEFAULT_MERGE_EVERY

DEFAULT_WRITE_CONCERN = WriteConcern(w="majority")
DEFAULT_READ_PREFERENCE = ReadPreference.PRIMARY


class BaseMongoSaver(BaseCheckpointSaver[str]):
    """Options and shared behaviour; subclasses only add the I/O runner."""

    lease_collection: str = LEASE_COLLECTION

    def __init__(
        self,
        client: Any,
        db_name: str = "langgraph",
        *,
        checkpoint_collection: str = "checkpoints",
        writes_collection: str = "checkpoint_writes",
        serde: SerializerProtocol | None = None,
        migrations: SchemaMigrations | None = None,
        write_back: bool = True,
        write_concern: WriteConcern | None = DEFAULT_WRITE_CONCERN,
        read_preference: _ServerMode | None = DEFAULT_READ_PREFERENCE,
        merge_every: int = DEFAULT_MERGE_EVERY,
        cache_size: int = 256,
        size_warning_bytes: int = 50_000,
        spill_bytes: int | None = 1_000_000,
    ) -> None:
        super().__init__(serde=serde or JsonPlusSerializer())
        self.client = client
        self.db_name = db_name
        self.migrations = migrations
        self._owns_client = False
        self.database = client.get_database(
            db_name, write_concern=write_concern, read_preference=read_preference
        )
        self.core = SaverCore(
            self.serde,
            checkpoint_collection=checkpoint_collection,
            writes_collection=writes_collection,
            migrations=migrations,
            write_back=write_back,
            merge_every=merge_every,
            cache_size=cache_size,
            size_warning_bytes=size_warning_bytes,
            spill_bytes=spill_bytes,
        )
        self._leases = LeaseRegistry()

    def _lease_state(self, thread_id: str, ttl: float, timeout: float | None) -> LeaseState:
        return LeaseState(self.lease_collection, thread_id, ttl=ttl, timeout=timeout)

    def _guard_write(self, config: Any) -> None:
        """Refuse a checkpoint write to a thread whose lease in this process was lost."""
        self._leases.guard(config)

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        return next_version(current)  # type: ignore[return-value]  # int only on int threads
