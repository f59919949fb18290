"""Pure tests of the value layout: log-structured appends, edits, snapshots (no database)."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from mongo_saver.values import (
    MAX_LEVEL,
    ChannelState,
    append_level,
    plan_values,
    resolve_values,
)

SERDE = JsonPlusSerializer()


def no_lift(channel: str, value: Any, a: int, b: int) -> tuple[str, Any]:
    raise AssertionError("no migration here")


def grow(
    turns: int, merge_every: int, edit_at: int | None = None
) -> tuple[list[int], dict[str, Any]]:
    """Append one item per version; return bytes stored per version and all entries."""
    state: ChannelState = {}
    entries: dict[str, Any] = {}
    sizes: list[int] = []
    value: list[str] = []
    for n in range(1, turns + 1):
        value = [*value, f"item {n:06} " + "x" * 40]
        if n == edit_at:
            value = ["edited", *value[1:]]
        version = f"{n:016}.0000000000"
        planned = plan_values(
            SERDE, thread_id="t", channel_values={"log": value},
            channel_versions={"log": version}, new_versions={"log": version},
            parent=state, merge_every=merge_every, schema_version=1,
        )
        state = planned.state
        sizes.append(sum(len(e["d"]) for e in planned.entries))
        entries.update((e["k"], e) for e in planned.entries)
        assert len(state["log"].chain) <= merge_every * (MAX_LEVEL + 1) + 1
        if n % 97 == 0 or n == turns:
            values, _ = resolve_values(SERDE, {"log": version}, {}, entries,
                                       schema_version=1, lift=no_lift)
            assert values["log"] == value
    return sizes, entries


def test_append_level_merges_runs_of_merge_every() -> None:
    full = 99
    assert append_level((full,), 4) == (0, 1)
    assert append_level((full, 0, 0, 0), 4) == (0, 4)
    assert append_level((full, 0, 0, 0, 0), 4) == (1, 1)
    assert append_level((full, 1, 1, 1, 0, 0, 0, 0), 4) == (1, 4)
    assert append_level((full, 1, 1, 1, 1, 0, 0, 0, 0), 4) == (2, 1)


def test_appends_stay_flat_and_read_back_exactly() -> None:
    sizes, entries = grow(2000, merge_every=8)
    first, last = sizes[100:300], sizes[-200:]
    # Merges rewrite each item once per level: the average cost of a version does not
    # grow with the length of the list (a full copy per 64 versions would make it 10x).
    assert sum(last) / len(last) <= 1.5 * sum(first) / len(first)
    assert not any(e["kind"] == "full" for e in list(entries.values())[1:])


def test_an_edited_list_is_stored_in_full_and_reads_back() -> None:
    sizes, entries = grow(300, merge_every=8, edit_at=150)
    assert sizes[149] > 20 * sizes[148]  # the edit: a full copy
    assert sum(e["kind"] == "full" for e in entries.values()) == 2


def test_snapshots_append_to_the_previous_snapshot() -> None:
    state: ChannelState = {}
    entries: dict[str, Any] = {}
    items: list[str] = []
    for n in range(1, 40):
        items = [*items, f"m{n}"]
        version = f"{n:016}.0000000000"
        snapshot = n % 5 == 0
        values = {"m": _DeltaSnapshot(list(items))} if snapshot else {}
        planned = plan_values(
            SERDE, thread_id="t", channel_values=values, channel_versions={"m": version},
            new_versions={"m": version}, parent=state, merge_every=4, schema_version=1,
        )
        state = planned.state
        entries.update((e["k"], e) for e in planned.entries)
        if snapshot:
            assert planned.entries[0]["kind"] == ("full" if n == 5 else "append")
            got, _ = resolve_values(SERDE, {"m": version}, {}, entries,
                                    schema_version=1, lift=no_lift)
            assert got["m"] == _DeltaSnapshot(items)
        else:
            assert planned.empty == ["m"] and not planned.entries
