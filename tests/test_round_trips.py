"""Round-trip counts and storage size, measured with pymongo command monitoring.

These assert counts and byte ratios only, never times: they hold on any server. The
listener is the benchmark's (`benchmarks/monitor.py`), so tests and benchmark count alike.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from pymongo import MongoClient

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.graphs import chat_graph, counter_graph, counter_input, messages, turn_input  # noqa: E402
from benchmarks.monitor import CommandCounter, Usage, measure  # noqa: E402
from benchmarks.savers import db_bytes_stored  # noqa: E402
from mongo_saver import MongoSaver  # noqa: E402


@pytest.fixture
def counter() -> CommandCounter:
    return CommandCounter()


@pytest.fixture
def counted_client(mongodb_uri: str, counter: CommandCounter) -> Iterator[MongoClient[Any]]:
    client: MongoClient[Any] = MongoClient(
        mongodb_uri, event_listeners=[counter], serverSelectionTimeoutMS=15_000
    )
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def saver(
    counted_client: MongoClient[Any], sync_client: MongoClient[Any], db_name: str
) -> Iterator[MongoSaver]:
    saver = MongoSaver(counted_client, db_name=db_name)
    saver.setup()
    try:
        yield saver
    finally:
        sync_client.drop_database(db_name)


def _config(thread_id: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _trips(usage: Usage) -> str:
    return f"{usage.round_trips} round trips: {usage.commands}"


def test_put_put_writes_and_get_tuple_are_one_round_trip_each(
    saver: MongoSaver, counter: CommandCounter
) -> None:
    state = messages(102)
    first = empty_checkpoint()
    v1 = saver.get_next_version(None)
    first["channel_values"] = {"messages": state[:100]}
    first["channel_versions"] = {"messages": v1}
    with measure(counter) as m:
        config1 = saver.put(_config("t"), first, {"source": "loop", "step": 0, "parents": {}},
                            {"messages": v1})
    assert m.usage.round_trips == 1, _trips(m.usage)

    with measure(counter) as m:
        saver.put_writes(config1, [("messages", [AIMessage(content="hi")])], "task-1")
    assert m.usage.round_trips == 1, _trips(m.usage)

    second = empty_checkpoint()
    v2 = saver.get_next_version(v1)
    second["channel_values"] = {"messages": state}
    second["channel_versions"] = {"messages": v2}
    with measure(counter) as m:
        config2 = saver.put(config1, second, {"source": "loop", "step": 1, "parents": {}},
                            {"messages": v2})
    assert m.usage.round_trips == 1, _trips(m.usage)

    with measure(counter) as m:
        latest = saver.get_tuple(_config("t"))
    assert m.usage.round_trips == 1, _trips(m.usage)
    assert latest is not None
    assert latest.config["configurable"]["checkpoint_id"] == config2["configurable"][
        "checkpoint_id"]
    assert latest.checkpoint["channel_values"]["messages"] == state

    with measure(counter) as m:
        by_id = saver.get_tuple(config1)
    assert m.usage.round_trips == 1, _trips(m.usage)
    assert by_id is not None
    assert by_id.checkpoint["channel_values"]["messages"] == state[:100]
    assert len(by_id.pending_writes or []) == 1


def test_get_tuple_is_one_round_trip_from_a_cold_saver(
    saver: MongoSaver, counted_client: MongoClient[Any], counter: CommandCounter, db_name: str
) -> None:
    """A second saver (empty cache) still reads an appended-to list in one query."""
    app = chat_graph().compile(checkpointer=saver)
    for turn in range(10):
        app.invoke(turn_input(turn), _config("chat"))
    cold = MongoSaver(counted_client, db_name=db_name)
    with measure(counter) as m:
        found = cold.get_tuple(_config("chat"))
    assert m.usage.round_trips == 1, _trips(m.usage)
    assert found is not None
    assert len(found.checkpoint["channel_values"]["messages"]) == 20


def test_list_limit_10_is_at_most_two_round_trips(
    saver: MongoSaver, counter: CommandCounter
) -> None:
    app = counter_graph().compile(checkpointer=saver)
    for turn in range(10):  # 3 checkpoints per turn
        app.invoke(counter_input(turn), _config("listed"))
    assert len(list(saver.list(_config("listed")))) == 30
    with measure(counter) as m:
        page = list(saver.list({"configurable": {"thread_id": "listed"}}, limit=10))
    assert len(page) == 10
    assert m.usage.round_trips <= 2, _trips(m.usage)


def test_delta_channel_history_is_at_most_two_round_trips_at_depth_60(
    saver: MongoSaver, counter: CommandCounter
) -> None:
    builder = chat_graph(delta=True, snapshot_frequency=10**6)
    reference = InMemorySaver()
    ours_app = builder.compile(checkpointer=saver)
    ref_app = builder.compile(checkpointer=reference)
    for turn in range(20):  # 3 checkpoints per turn: depth 60
        ours_app.invoke(turn_input(turn), _config("delta"))
        ref_app.invoke(turn_input(turn), _config("delta"))
    assert len(list(saver.list(_config("delta")))) == 60

    with measure(counter) as m:
        history = saver.get_delta_channel_history(config=_config("delta"),
                                                  channels=["messages"])
    assert m.usage.round_trips <= 2, _trips(m.usage)

    expected = reference.get_delta_channel_history(config=_config("delta"),
                                                   channels=["messages"])

    def contents(h: Any) -> list[str]:
        out: list[str] = []
        for _, _, value in h["messages"]["writes"]:
            for msg in value if isinstance(value, list) else [value]:
                out.append(str(msg.content))
        return out

    assert contents(history) == contents(expected)
    assert ("seed" in history["messages"]) == ("seed" in expected["messages"])


def test_bytes_stored_after_50_turns_are_at_most_a_fifth_of_the_incumbents(
    saver: MongoSaver, counted_client: MongoClient[Any], sync_client: MongoClient[Any],
    db_name: str,
) -> None:
    mongodb = pytest.importorskip("langgraph.checkpoint.mongodb")
    incumbent_db = f"{db_name}_inc"
    incumbent = mongodb.MongoDBSaver(counted_client, db_name=incumbent_db)
    try:
        for checkpointer in (saver, incumbent):
            app = chat_graph().compile(checkpointer=checkpointer)
            for turn in range(50):
                app.invoke(turn_input(turn), _config("chat"))
            assert len(app.get_state(_config("chat")).values["messages"]) == 100
        ours = db_bytes_stored(sync_client, db_name)["total_bytes"]
        theirs = db_bytes_stored(sync_client, incumbent_db)["total_bytes"]
        assert ours * 5 <= theirs, f"ours {ours} B, incumbent {theirs} B"
    finally:
        sync_client.drop_database(incumbent_db)


def test_a_delta_channel_chat_turn_costs_no_more_round_trips_than_a_plain_turn(
    counted_client: MongoClient[Any], counter: CommandCounter, db_name: str
) -> None:
    """The history LangGraph asks for after get_tuple comes with get_tuple's own reply."""
    per_turn: dict[bool, list[int]] = {}
    for delta in (False, True):
        saver = MongoSaver(counted_client, db_name=f"{db_name}_{int(delta)}")
        saver.setup()
        graph = chat_graph(delta=delta, snapshot_frequency=4).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "chat"}}
        trips = []
        for turn in range(12):
            with measure(counter) as usage:
                graph.invoke(turn_input(turn), config)
            trips.append(usage.usage.round_trips)
        per_turn[delta] = trips
    assert max(per_turn[True]) <= min(per_turn[False]), per_turn
