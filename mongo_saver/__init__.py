"""MongoDB checkpointers for LangGraph, sync and native async, with lazy schema migrations."""

from mongo_saver.aio import AsyncMongoSaver
from mongo_saver.errors import (
    CorruptDocumentError,
    InvalidInputError,
    LeaseError,
    MigrationError,
    MongoSaverError,
    SchemaVersionError,
)
from mongo_saver.migrations import SchemaMigrations
from mongo_saver.sync import MongoSaver

__all__ = [
    "AsyncMongoSaver",
    "CorruptDocumentError",
    "InvalidInputError",
    "LeaseError",
    "MigrationError",
    "MongoSaver",
    "MongoSaverError",
    "SchemaMigrations",
    "SchemaVersionError",
]
