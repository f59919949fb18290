"""Demo agent, schema v1 -> v2.

v1 state: ``retrieved_context: Annotated[list[str], operator.add]`` and a lower-case
``route``. v2 state: ``context: Annotated[list[dict], operator.add]`` whose items are
``{"text": ...}``, an upper-case ``route`` and a new ``summary: str``.

One file per step: ``VERSION`` is the schema version this step upgrades from, and
``upgrade(m)`` declares the step's channel operations. ``load_migrations("migrations")``
collects every file of this folder into one `SchemaMigrations` registry.
"""

from __future__ import annotations

from typing import Any

from mongo_saver.migrations import StepBuilder

VERSION = 1


def _as_context_item(text: Any) -> dict[str, Any]:
    # Idempotent: an item that already has the v2 shape is kept as it is.
    return text if isinstance(text, dict) else {"text": str(text)}


def _upper_route(route: Any) -> Any:
    return route.upper() if isinstance(route, str) else route


def upgrade(m: StepBuilder) -> None:
    """Rename the retrieval channel, wrap its items, upper-case the route, add a summary."""
    m.rename_channel("retrieved_context", "context")
    m.map_items("context", _as_context_item)  # accumulating channel: every item, every write
    m.map_value("route", _upper_route)  # replaced channel: the whole value
    m.add_channel("summary", default="")
