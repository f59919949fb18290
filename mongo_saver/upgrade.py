"""Version checks on every document read, and the hook where old documents are upgraded.

A document newer than this code (a rollback after a deploy) is refused with a clear
error instead of being misread or silently downgraded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mongo_saver.documents import FORMAT_VERSION
from mongo_saver.errors import SchemaVersionError
from mongo_saver.ops import Document, Plan

if TYPE_CHECKING:
    from mongo_saver.core import SaverCore
    from mongo_saver.migrations import SchemaMigrations


class DocumentUpgrader:
    """Checks `format` and `schema_version` of each checkpoint document read."""

    def __init__(self, current_schema_version: int = 1) -> None:
        self.current_schema_version = current_schema_version

    @classmethod
    def for_migrations(
        cls, migrations: SchemaMigrations | None, *, write_back: bool
    ) -> DocumentUpgrader:
        return cls(migrations.current_version if migrations else 1)

    def check(self, doc: Document) -> None:
        fmt = doc.get("format")
        schema = doc.get("schema_version")
        where = f"checkpoint {doc.get('checkpoint_id')} of thread {doc.get('thread_id')!r}"
        if isinstance(fmt, int) and fmt > FORMAT_VERSION:
            raise SchemaVersionError(
                f"{where} has storage format {fmt}, newer than this mongo-saver "
                f"(format {FORMAT_VERSION}); upgrade mongo-saver instead of reading it"
            )
        if isinstance(schema, int) and schema > self.current_schema_version:
            raise SchemaVersionError(
                f"{where} has schema_version {schema}, newer than this application's "
                f"migrations (version {self.current_schema_version}); "
                "was a deploy rolled back?"
            )

    def upgrade(self, core: SaverCore, doc: Document) -> Plan[Document]:
        """Return `doc` in the current layout and schema (a plan: it may write back)."""
        self.check(doc)
        if False:  # a plan by signature; the migration layer yields its write-backs here
            yield
        return doc
