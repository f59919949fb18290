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


def test_reply_too_large_recognises_only_size_refusals() -> None:
    from pymongo.errors import OperationFailure

    from mongo_saver.core import reply_too_large

    assert reply_too_large(OperationFailure("BSONObj size: 17000000 (0x1) is invalid. "
                                            "Size must be between 0 and 16793600", 10334))
    assert reply_too_large(OperationFailure(
        "Total size of documents in checkpoints matching pipeline's $lookup stage exceeds "
        "104857600 bytes", 4568))
    assert not reply_too_large(OperationFailure("unknown operator: $foo", 2))
    assert not reply_too_large(OperationFailure("not primary", 10107))


def big_state_thread(saver: Any, groups: int) -> dict[str, Any]:
    """Checkpoints each adding 9 channels of 0.9 MB (under spill_bytes, about 8 MB a
    document), then one that needs them all: about 8 MB x `groups` in one read."""
    from langgraph.checkpoint.base import empty_checkpoint

    config: dict[str, Any] = {"configurable": {"thread_id": uuid.uuid4().hex,
                                               "checkpoint_ns": ""}}
    versions: dict[str, str] = {}
    for step in range(groups + 1):
        new = {f"c{step}_{i}": f"{step}{i}" * 450_000 for i in range(9)} if step < groups else {}
        versions.update({k: f"{step + 1:016}.0000000001" for k in new})
        values = {k: f"{k[1:].replace('_', '')}" * 450_000 for k in versions}
        checkpoint = {**empty_checkpoint(), "channel_values": values,
                      "channel_versions": dict(versions)}
        config = saver.put(config, checkpoint, {"source": "loop", "step": step},
                           {k: versions[k] for k in new})
    return config


def test_a_read_past_16_mb_comes_back_whole(make_sync_saver: Any) -> None:
    """Real MongoDB refuses a reply document over 16 MB and the saver then reads in
    parts; the test servers return such replies, so both paths are checked here: the
    single aggregation, and `read_in_parts` run directly."""
    config = big_state_thread(make_sync_saver(), groups=3)
    fresh = make_sync_saver()
    whole = fresh.get_tuple(config)
    assert len(whole.checkpoint["channel_values"]) == 27
    assert all(len(v) == 900_000 for v in whole.checkpoint["channel_values"].values())
    core, run = fresh.core, make_sync_saver()._runner.run
    match = {"thread_id": config["configurable"]["thread_id"], "checkpoint_ns": "",
             "checkpoint_id": config["configurable"]["checkpoint_id"]}
    parts = run(core.read_in_parts(match, 1))
    assert run(core.tuple_from_document(parts[0])) == whole
