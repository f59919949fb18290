"""Application schema migrations, applied lazily to checkpoints as they are read."""

from __future__ import annotations


class SchemaMigrations:
    """An ordered registry of migration steps; see the migrations guide in `docs/`."""

    def __init__(self) -> None:
        self.steps: dict[int, object] = {}

    @property
    def current_version(self) -> int:
        return max(self.steps, default=0) + 1
