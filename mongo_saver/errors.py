"""Exceptions raised by mongo-saver.

Every failure the saver detects is raised as a subclass of `MongoSaverError`, so an
application can catch the whole family, and each message names the thread, checkpoint,
channel or key at fault.
"""

from __future__ import annotations


class MongoSaverError(Exception):
    """Base class of every error raised by mongo-saver itself."""


class InvalidInputError(MongoSaverError, ValueError):
    """A config, filter, key or value was rejected before anything was written."""


class CorruptDocumentError(MongoSaverError):
    """A stored document cannot be decoded; nothing was changed."""


class SchemaVersionError(MongoSaverError):
    """A stored document is newer than this code knows (a rollback after a deploy)."""


class MigrationError(MongoSaverError):
    """A migration step raised; the stored documents were left exactly as they were."""


class LeaseError(MongoSaverError):
    """A thread lease could not be acquired, or was lost while held."""
