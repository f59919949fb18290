"""Values and writes past MongoDB's 16 MB document limit, over the wire."""

from __future__ import annotations

import operator
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from pymongo import MongoClient

from mongo_saver import InvalidInputError

BIG = 17 * 1024 * 1024


class State(TypedDict):
    blob: str
    notes: Annotated[list[str], operator.add]


def graph_with_big_output(checkpointer: Any, size: int) -> Any:
    def produce(state: State) -> dict[str, Any]:
        return {"blob": "x" * size, "notes": ["made a big blob"]}

    builder = StateGraph(State)
    builder.add_node("produce", produce)
    builder.add_edge(START, "produce")
    builder.add_edge("produce", END)
    return builder.compile(checkpointer=checkpointer)


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def test_value_over_16_mb_is_spilled_and_read_back_whole(
    make_sync_saver: Any, sync_client: MongoClient[Any], db_name: str
) -> None:
    saver = make_sync_saver()
    thread = uuid.uuid4().hex
    graph = graph_with_big_output(saver, BIG)
    graph.invoke({"blob": "", "notes": []}, cfg(thread))
    chunks = sync_client[db_name]["checkpoints_chunks"]
    assert chunks.count_documents({"thread_id": thread}) >= 5
    fresh = make_sync_saver()  # nothing cached: the value comes back from the chunks
    values = graph_with_big_output(fresh, 0).get_state(cfg(thread)).values
    assert len(values["blob"]) == BIG and values["notes"] == ["made a big blob"]
    history = list(fresh.list(cfg(thread)))
    assert len(history) == 3
    fresh.copy_thread(thread, thread + "-copy")
    copied = graph_with_big_output(make_sync_saver(), 0).get_state(cfg(thread + "-copy"))
    assert len(copied.values["blob"]) == BIG
    fresh.delete_thread(thread)
    assert chunks.count_documents({"thread_id": thread}) == 0


def test_pending_write_over_16_mb_survives_a_failure(
    make_sync_saver: Any, sync_client: MongoClient[Any]
) -> None:
    saver = make_sync_saver()
    thread = uuid.uuid4().hex
    saver.put(
        {"configurable": {"thread_id": thread, "checkpoint_ns": ""}},
        {"v": 1, "id": "1f0a0000-0000-6000-8000-000000000001", "ts": "2026-01-01T00:00:00Z",
         "channel_values": {}, "channel_versions": {}, "versions_seen": {},
         "updated_channels": None},
        {"source": "loop", "step": 0},
        {},
    )
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": "",
                               "checkpoint_id": "1f0a0000-0000-6000-8000-000000000001"}}
    saver.put_writes(config, [("blob", "y" * BIG), ("small", 1)], "task-1", "path")
    pending = make_sync_saver().get_tuple(config).pending_writes
    assert [(c, len(v) if isinstance(v, str) else v) for _, c, v in pending] == [
        ("blob", BIG), ("small", 1)]


def test_spilling_disabled_refuses_a_value_over_16_mb_before_writing(
    make_sync_saver: Any, sync_client: MongoClient[Any], db_name: str
) -> None:
    saver = make_sync_saver(spill_bytes=None)
    thread = uuid.uuid4().hex
    graph = graph_with_big_output(saver, BIG)
    with pytest.raises(InvalidInputError, match=r"16 MB document limit.*blob"):
        graph.invoke({"blob": "", "notes": []}, cfg(thread))
    stored = [d["metadata"]["step"] for d in
              sync_client[db_name]["checkpoints"].find({"thread_id": thread})]
    assert sorted(stored) == [-1, 0]  # the checkpoints before the big value, nothing after
