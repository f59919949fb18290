"""`get_delta_channel_history` and DeltaChannel threads, checked against LangGraph's own
`InMemorySaver` as the reference, and through prune, delete_for_runs and copy_thread."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from tests.conftest import async_client_for, close_async_client


def concat(state: list[Any], writes: Sequence[list[Any]]) -> list[Any]:
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


def append_messages(state: list[Any], writes: Sequence[Any]) -> list[Any]:
    for w in writes:
        state = add_messages(state, w)
    return state


# --- saver-level history, step by step -------------------------------------------------


class ThreadBuilder:
    """Writes the same checkpoints and writes to several savers at once."""

    def __init__(self, savers: Sequence[BaseCheckpointSaver[Any]], thread_id: str) -> None:
        self.savers = savers
        self.thread_id = thread_id
        self.configs: list[dict[str, Any]] = [{} for _ in savers]
        self.version = 0
        self.ids: list[str] = []

    def checkpoint(self, values: dict[str, Any], new: Sequence[str], parent: int | None = -1,
                   versions: dict[str, Any] | None = None) -> dict[str, Any]:
        """Put a checkpoint; `new` channels get a fresh version, missing values are empty."""
        self.version += 1
        cid = str(uuid6(clock_seq=self.version))
        versions = dict(versions or {})
        for ch in new:
            versions[ch] = f"{self.version:032}.0"
        checkpoint = {"v": 1, "id": cid, "ts": "2026-01-01T00:00:00+00:00",
                      "channel_values": values, "channel_versions": versions,
                      "versions_seen": {}, "updated_channels": list(new)}
        parent_id = None if parent is None else (self.ids[parent] if self.ids else None)
        for i, saver in enumerate(self.savers):
            cfg = {"configurable": {"thread_id": self.thread_id, "checkpoint_ns": ""}}
            if parent_id:
                cfg["configurable"]["checkpoint_id"] = parent_id
            self.configs[i] = saver.put(cfg, checkpoint, {"source": "loop", "step": self.version},
                                        {ch: versions[ch] for ch in new})
        self.ids.append(cid)
        return versions

    def writes(self, writes: list[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        for i, saver in enumerate(self.savers):
            saver.put_writes(self.configs[i], writes, task_id, task_path)

    def history(self, channels: Sequence[str], at: int = -1) -> list[Any]:
        cfg = {"configurable": {"thread_id": self.thread_id, "checkpoint_ns": "",
                                "checkpoint_id": self.ids[at]}}
        return [dict(s.get_delta_channel_history(config=cfg, channels=channels))
                for s in self.savers]


def test_history_oldest_first_seed_and_target_writes_excluded(saver: Any) -> None:
    ref = InMemorySaver()
    t = ThreadBuilder([saver, ref], uuid.uuid4().hex)
    v = t.checkpoint({"m": _DeltaSnapshot(["s0"])}, ["m"], parent=None)
    t.writes([("m", ["a"])], "task-1", "~__pregel_pull, n")
    v = t.checkpoint({}, ["m"], versions=v)
    t.writes([("m", ["b"]), ("other", 1)], "task-2", "~__pregel_pull, n")
    v = t.checkpoint({}, ["m"], versions=v)
    t.writes([("m", ["c"])], "task-3", "~__pregel_pull, n")  # the target's own writes
    ours, reference = t.history(["m", "absent"])
    assert ours == reference
    assert ours["m"]["seed"] == _DeltaSnapshot(["s0"])
    assert [w[2] for w in ours["m"]["writes"]] == [["a"], ["b"]]
    assert ours["absent"] == {"writes": []}


def test_history_accepts_plain_value_seed_and_nearest_snapshot(saver: Any) -> None:
    ref = InMemorySaver()
    t = ThreadBuilder([saver, ref], uuid.uuid4().hex)
    v = t.checkpoint({"m": ["plain"]}, ["m"], parent=None)  # a pre-delta plain value
    t.writes([("m", ["a"])], "t1")
    v = t.checkpoint({}, ["m"], versions=v)
    t.writes([("m", ["b"])], "t2")
    v = t.checkpoint({"m": _DeltaSnapshot(["plain", "a", "b"])}, ["m"], versions=v)
    t.writes([("m", ["c"])], "t3")
    v = t.checkpoint({}, ["m"], versions=v)
    ours, reference = t.history(["m"])
    assert ours == reference
    assert ours["m"]["seed"] == _DeltaSnapshot(["plain", "a", "b"])
    assert [w[2] for w in ours["m"]["writes"]] == [["c"]]
    ours_at_1, reference_at_1 = t.history(["m"], at=1)
    assert ours_at_1 == reference_at_1 and ours_at_1["m"]["seed"] == ["plain"]


def test_history_orders_writes_by_writes_sort_key(saver: Any) -> None:
    ref = InMemorySaver()
    t = ThreadBuilder([saver, ref], uuid.uuid4().hex)
    v = t.checkpoint({}, ["m"], parent=None)
    t.writes([("m", ["z-path"])], "task-a", "~__pregel_pull, z")
    t.writes([("m", ["a-path"])], "task-z", "~__pregel_pull, a")
    t.writes([("m", ["input"])], "task-m", "")
    t.checkpoint({}, ["m"], versions=v)
    ours, reference = t.history(["m"])
    assert ours == reference
    assert [w[2] for w in ours["m"]["writes"]] == [["input"], ["a-path"], ["z-path"]]


def test_get_tuple_pending_writes_in_writes_sort_key_order(saver: Any) -> None:
    t = ThreadBuilder([saver], uuid.uuid4().hex)
    t.checkpoint({"x": 1}, ["x"], parent=None)
    t.writes([("c", "second"), ("c", "third")], "task-b", "~__pregel_pull, b")
    t.writes([("c", "first")], "task-a", "~__pregel_pull, a")
    t.writes([("__error__", "boom")], "task-b", "~__pregel_pull, b")
    pending = saver.get_tuple(t.configs[0]).pending_writes
    assert [(tid, v) for tid, _, v in pending] == [
        ("task-a", "first"), ("task-b", "boom"), ("task-b", "second"), ("task-b", "third")]


def test_history_follows_the_fork_not_the_newest_branch(saver: Any) -> None:
    ref = InMemorySaver()
    t = ThreadBuilder([saver, ref], uuid.uuid4().hex)
    v = t.checkpoint({"m": ["root"]}, ["m"], parent=None)
    t.writes([("m", ["on-path"])], "t1")
    v2 = t.checkpoint({}, ["m"], versions=v)  # index 1
    t.writes([("m", ["branch-1"])], "t2")
    t.checkpoint({}, ["m"], versions=v2)  # index 2, child of 1
    t.checkpoint({}, ["m"], parent=1, versions=v2)  # index 3: a fork of 1
    ours, reference = t.history(["m"])
    assert ours == reference
    assert [w[2] for w in ours["m"]["writes"]] == [["on-path"], ["branch-1"]]


operations = st.lists(
    st.tuples(
        st.sampled_from(["write", "checkpoint", "snapshot", "fork"]),
        st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3),
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=operations)
def test_history_matches_in_memory_saver(saver: Any, ops: list[tuple[str, list[str]]]) -> None:
    ref = InMemorySaver()
    t = ThreadBuilder([saver, ref], uuid.uuid4().hex)
    versions = t.checkpoint({}, ["m", "n"], parent=None)
    for n, (op, items) in enumerate(ops):
        if op == "write":
            t.writes([("m", items), ("n", items[:1])], f"task-{n}", f"~p, {items[0]}")
        elif op == "snapshot":
            versions = t.checkpoint({"m": _DeltaSnapshot(items)}, ["m"], versions=versions)
        elif op == "fork" and len(t.ids) > 1:
            versions = t.checkpoint({}, ["n"], parent=len(t.ids) - 2, versions=versions)
        else:
            versions = t.checkpoint({}, ["m"], versions=versions)
    for at in range(len(t.ids)):
        ours, reference = t.history(["m", "n"], at=at)
        assert ours == reference


# --- DeltaChannel graphs -----------------------------------------------------------------


class DeltaState(TypedDict):
    messages: Annotated[list, DeltaChannel(append_messages, snapshot_frequency=3)]


class PlainState(TypedDict):
    messages: Annotated[list, add_messages]


def chat_graph(state_type: type, checkpointer: Any) -> Any:
    def reply(state: Any) -> dict[str, Any]:
        last = state["messages"][-1].content
        return {"messages": [AIMessage(content=f"echo: {last}", id=f"ai-{last}")]}

    builder = StateGraph(state_type)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=checkpointer)


def say(graph: Any, cfg: dict[str, Any], text: str) -> list[str]:
    """One chat turn, as its own run (so `delete_for_runs` can target it)."""
    out = graph.invoke({"messages": [HumanMessage(content=text, id=f"h-{text}")]},
                       {**cfg, "metadata": {"run_id": uuid.uuid4().hex}})
    return [m.content for m in out["messages"]]


def test_delta_channel_chat_matches_plain_channel(saver: Any) -> None:
    delta, plain = chat_graph(DeltaState, saver), chat_graph(PlainState, InMemorySaver())
    cfg_d, cfg_p = {"configurable": {"thread_id": uuid.uuid4().hex}}, {
        "configurable": {"thread_id": "p"}}
    for turn in range(8):
        assert say(delta, cfg_d, f"t{turn}") == say(plain, cfg_p, f"t{turn}")
    assert delta.get_state(cfg_d).values == plain.get_state(cfg_p).values
    for old_d, old_p in zip(delta.get_state_history(cfg_d), plain.get_state_history(cfg_p),
                            strict=True):
        assert old_d.values == old_p.values


async def test_delta_channel_chat_async(async_saver: Any) -> None:
    graph = chat_graph(DeltaState, async_saver)
    cfg = {"configurable": {"thread_id": uuid.uuid4().hex}}
    for turn in range(5):
        await graph.ainvoke({"messages": [HumanMessage(content=f"t{turn}", id=f"h{turn}")]}, cfg)
    state = await graph.aget_state(cfg)
    assert [m.content for m in state.values["messages"]][-2:] == ["t4", "echo: t4"]
    assert len(state.values["messages"]) == 10


@pytest.mark.parametrize("operation", ["prune", "delete_for_runs", "copy_thread"])
def test_maintenance_never_breaks_a_delta_thread(saver: Any, operation: str) -> None:
    graph = chat_graph(DeltaState, saver)
    thread = uuid.uuid4().hex
    cfg = {"configurable": {"thread_id": thread}}
    for turn in range(7):
        say(graph, cfg, f"t{turn}")
    expected = graph.get_state(cfg).values
    first_run = [t for t in saver.list(cfg)][-1].metadata["run_id"]
    if operation == "prune":
        saver.prune([thread], strategy="keep_latest")
    elif operation == "delete_for_runs":
        saver.delete_for_runs([first_run])
    else:
        saver.copy_thread(thread, thread + "-copy")
        cfg = {"configurable": {"thread_id": thread + "-copy"}}
    assert graph.get_state(cfg).values == expected
    say(graph, cfg, "after")
    assert [m.content for m in graph.get_state(cfg).values["messages"]][-2:] == [
        "after", "echo: after"]


def test_prune_keep_latest_on_plain_thread_keeps_only_latest(saver: Any) -> None:
    graph = chat_graph(PlainState, saver)
    cfg = {"configurable": {"thread_id": uuid.uuid4().hex}}
    for turn in range(6):
        say(graph, cfg, f"t{turn}")
    expected = graph.get_state(cfg).values
    saver.prune([cfg["configurable"]["thread_id"]])
    assert len(list(saver.list(cfg))) == 1
    assert graph.get_state(cfg).values == expected


async def test_async_history_via_motor_and_pymongo(mongodb_uri: str, db_name: str) -> None:
    from mongo_saver import AsyncMongoSaver

    for kind in ("pymongo-async", "motor"):
        client = async_client_for(kind, mongodb_uri)
        saver = AsyncMongoSaver(client, db_name=db_name)
        await saver.setup()
        graph = chat_graph(DeltaState, saver)
        cfg = {"configurable": {"thread_id": f"{kind}-{uuid.uuid4().hex}"}}
        for turn in range(4):
            await graph.ainvoke({"messages": [HumanMessage(content=f"t{turn}")]}, cfg)
        state = await graph.aget_state(cfg)
        assert len(state.values["messages"]) == 8
        await close_async_client(client)


def test_history_served_from_get_tuple_prefetch_equals_full_walk(make_sync_saver: Any) -> None:
    """After get_tuple, the history of that checkpoint comes from what the read fetched
    ahead; it must equal what a saver with nothing cached computes from the database."""
    saver = make_sync_saver()
    graph = chat_graph(DeltaState, saver)
    cfg = {"configurable": {"thread_id": uuid.uuid4().hex}}
    for turn in range(9):
        say(graph, cfg, f"t{turn}")
    fresh = make_sync_saver()
    checked = 0
    for tup in saver.list(cfg):
        saver.get_tuple(tup.config)
        served = saver.get_delta_channel_history(config=tup.config, channels=["messages"])
        assert served == fresh.get_delta_channel_history(config=tup.config,
                                                         channels=["messages"])
        checked += 1
    assert checked > 20
