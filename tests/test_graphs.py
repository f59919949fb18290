"""LangGraph's documented persistence behaviour, end to end, over the wire."""

from __future__ import annotations

import operator
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from tests.graph_defs import flaky_graph, ran

REPO = Path(__file__).resolve().parent.parent


class State(TypedDict):
    foo: str
    bar: Annotated[list[str], operator.add]


def two_step_graph(checkpointer: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("node_a", lambda s: {"foo": "a", "bar": ["a"]})
    builder.add_node("node_b", lambda s: {"foo": "b", "bar": ["b"]})
    builder.add_edge(START, "node_a")
    builder.add_edge("node_a", "node_b")
    builder.add_edge("node_b", END)
    return builder.compile(checkpointer=checkpointer)


def config(thread_id: str | None = None) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id or uuid.uuid4().hex}}


@pytest.mark.parametrize("durability", ["exit", "async", "sync"])
def test_two_nodes_leave_four_checkpoints(saver: Any, durability: str) -> None:
    graph = two_step_graph(saver)
    cfg = config()
    result = graph.invoke({"foo": "", "bar": []}, cfg, durability=durability)
    assert result == {"foo": "b", "bar": ["a", "b"]}
    history = list(graph.get_state_history(cfg))
    steps = [s.metadata["step"] for s in history]
    if durability == "exit":
        assert steps[0] == 2 and history[0].values == {"foo": "b", "bar": ["a", "b"]}
    else:
        assert steps == [2, 1, 0, -1]
    assert graph.get_state(cfg).values == {"foo": "b", "bar": ["a", "b"]}


async def test_two_nodes_async(async_saver: Any) -> None:
    graph = two_step_graph(async_saver)
    cfg = config()
    assert await graph.ainvoke({"foo": "", "bar": []}, cfg) == {"foo": "b", "bar": ["a", "b"]}
    history = [s async for s in graph.aget_state_history(cfg)]
    assert [s.metadata["step"] for s in history] == [2, 1, 0, -1]
    assert [s.metadata["source"] for s in history] == ["loop", "loop", "loop", "input"]


def test_failure_then_resume_in_a_new_process(
    saver: Any, mongodb_uri: str, db_name: str, tmp_path: Path
) -> None:
    log, fail = tmp_path / "log", tmp_path / "fail"
    fail.touch()
    os.environ["MS_TEST_LOG"], os.environ["MS_FAIL"] = str(log), str(fail)
    try:
        graph = flaky_graph(saver)
        thread = uuid.uuid4().hex
        with pytest.raises(RuntimeError, match="failed on purpose"):
            graph.invoke({"steps": []}, config(thread))
        assert graph.get_state(config(thread)).next == ("step_2",)
        assert ran(str(log)) == ["step_1", "step_2"]
        fail.unlink()
        child = subprocess.run(
            [sys.executable, "-m", "tests.graph_defs", mongodb_uri, db_name, thread],
            cwd=REPO, capture_output=True, text=True, timeout=120, env=os.environ.copy(),
        )
        assert child.returncode == 0, child.stderr
        assert "['step_1', 'step_2', 'step_3']" in child.stdout
        # The new process ran step_2 and step_3 only: step_1 was not re-run.
        assert ran(str(log)) == ["step_1", "step_2", "step_2", "step_3"]
    finally:
        del os.environ["MS_TEST_LOG"], os.environ["MS_FAIL"]


class ParallelState(TypedDict):
    results: Annotated[list[str], operator.add]


def test_parallel_success_survives_sibling_failure(saver: Any) -> None:
    calls = {"good": 0, "bad": 0}
    should_fail = [True]

    def good(state: ParallelState) -> dict[str, Any]:
        calls["good"] += 1
        return {"results": ["good"]}

    def bad(state: ParallelState) -> dict[str, Any]:
        calls["bad"] += 1
        if should_fail[0]:
            raise ValueError("bad node failed")
        return {"results": ["bad"]}

    builder = StateGraph(ParallelState)
    builder.add_node("good", good)
    builder.add_node("bad", bad)
    builder.add_edge(START, "good")
    builder.add_edge(START, "bad")
    builder.add_edge("good", END)
    builder.add_edge("bad", END)
    graph = builder.compile(checkpointer=saver)
    cfg = config()
    with pytest.raises(ValueError):
        graph.invoke({"results": []}, cfg)
    pending = saver.get_tuple(cfg).pending_writes
    assert ("results", ["good"]) in [(ch, v) for _, ch, v in pending]
    should_fail[0] = False
    result = graph.invoke(None, cfg)
    assert sorted(result["results"]) == ["bad", "good"]
    assert calls == {"good": 1, "bad": 2}


def test_threads_never_mix(saver: Any) -> None:
    graph = two_step_graph(saver)
    first, second = config(), config()
    graph.invoke({"foo": "", "bar": ["first"]}, first)
    graph.invoke({"foo": "", "bar": ["second"]}, second)
    assert graph.get_state(first).values["bar"] == ["first", "a", "b"]
    assert graph.get_state(second).values["bar"] == ["second", "a", "b"]
    assert len(list(graph.get_state_history(first))) == 4


def test_missing_thread_id_raises_langgraph_error(saver: Any) -> None:
    graph = two_step_graph(saver)
    with pytest.raises(ValueError, match="thread_id"):
        graph.invoke({"foo": "", "bar": []}, {"configurable": {}})


class ApprovalState(TypedDict):
    request: str
    decision: str


def test_interrupt_then_resume_with_command(saver: Any) -> None:
    def ask(state: ApprovalState) -> dict[str, Any]:
        return {"decision": interrupt({"question": f"approve {state['request']}?"})}

    builder = StateGraph(ApprovalState)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=saver)
    cfg = config()
    first = graph.invoke({"request": "deploy", "decision": ""}, cfg)
    assert first["__interrupt__"][0].value == {"question": "approve deploy?"}
    assert graph.get_state(cfg).next == ("ask",)
    assert graph.invoke(Command(resume="yes"), cfg) == {"request": "deploy", "decision": "yes"}


def test_time_travel_replay_and_fork(saver: Any) -> None:
    graph = two_step_graph(saver)
    cfg = config()
    graph.invoke({"foo": "", "bar": []}, cfg)
    after_a = next(s for s in graph.get_state_history(cfg) if s.metadata["step"] == 1)
    assert after_a.values == {"foo": "a", "bar": ["a"]} and after_a.next == ("node_b",)
    replayed = graph.invoke(None, after_a.config)
    assert replayed == {"foo": "b", "bar": ["a", "b"]}
    forked = graph.update_state(after_a.config, {"foo": "forked", "bar": ["x"]})
    assert graph.get_state(forked).values == {"foo": "forked", "bar": ["a", "x"]}
    assert graph.invoke(None, forked) == {"foo": "b", "bar": ["a", "x", "b"]}
    assert graph.get_state(cfg).values == {"foo": "b", "bar": ["a", "x", "b"]}


class Inner(TypedDict):
    bar: Annotated[list[str], operator.add]


def test_subgraph_checkpoints_carry_their_namespace(saver: Any) -> None:
    def inner_node(state: Inner) -> dict[str, Any]:
        return {"bar": ["inner"]}

    def pause(state: Inner) -> dict[str, Any]:
        interrupt("pause in the subgraph")
        return {"bar": ["after"]}

    inner = StateGraph(Inner)
    inner.add_node("inner_node", inner_node)
    inner.add_node("pause", pause)
    inner.add_edge(START, "inner_node")
    inner.add_edge("inner_node", "pause")
    outer = StateGraph(Inner)
    outer.add_node("sub", inner.compile())
    outer.add_edge(START, "sub")
    graph = outer.compile(checkpointer=saver)
    cfg = config()
    graph.invoke({"bar": []}, cfg)
    state = graph.get_state(cfg, subgraphs=True)
    sub_config = state.tasks[0].state.config
    assert sub_config["configurable"]["checkpoint_ns"].startswith("sub:")
    namespaces = {t.config["configurable"]["checkpoint_ns"] for t in saver.list(cfg)}
    assert "" in namespaces and any(ns.startswith("sub:") for ns in namespaces)
    assert graph.invoke(Command(resume=True), cfg)["bar"] == ["inner", "after"]


class TwoChannelState(TypedDict):
    results: Annotated[list[str], operator.add]
    notes: Annotated[list[str], operator.add]


def test_a_partially_stored_task_is_run_again_not_half_applied(
    saver: Any, sync_client: Any, db_name: str
) -> None:
    """A connection lost in the middle of put_writes can store some of a task's writes.
    LangGraph treats a task with stored writes as done, so those must stay hidden until
    the batch is whole: the task then runs again and nothing is lost."""
    calls = {"good": 0}
    should_fail = [True]

    def good(state: TwoChannelState) -> dict[str, Any]:
        calls["good"] += 1
        return {"results": ["good"], "notes": ["from good"]}

    def bad(state: TwoChannelState) -> dict[str, Any]:
        if should_fail[0]:
            raise ValueError("bad node failed")
        return {"results": ["bad"]}

    builder = StateGraph(TwoChannelState)
    builder.add_node("good", good)
    builder.add_node("bad", bad)
    builder.add_edge(START, "good")
    builder.add_edge(START, "bad")
    graph = builder.compile(checkpointer=saver)
    cfg = config()
    with pytest.raises(ValueError):
        graph.invoke({"results": [], "notes": []}, cfg)
    writes = sync_client[db_name]["checkpoint_writes"]
    lost = writes.find_one({"thread_id": cfg["configurable"]["thread_id"], "channel": "notes",
                            "task_path": {"$regex": "good"}})
    writes.delete_one({"_id": lost["_id"]})  # as if the connection dropped half-way
    should_fail[0] = False
    fresh = type(saver)(sync_client, db_name=db_name)
    result = builder.compile(checkpointer=fresh).invoke(None, cfg)
    assert sorted(result["results"]) == ["bad", "good"] and result["notes"] == ["from good"]
    assert calls["good"] == 2


def test_async_saver_serves_the_blocking_api_from_another_thread(mongodb_uri: str,
                                                                  db_name: str) -> None:
    """LangGraph's sync API may be handed an async saver: its blocking methods run on the
    saver's event loop from other threads, and refuse clearly on the loop itself."""
    import asyncio
    import threading

    from pymongo import AsyncMongoClient

    from mongo_saver import AsyncMongoSaver, MongoSaverError

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()

    async def make() -> AsyncMongoSaver:
        saver = AsyncMongoSaver(AsyncMongoClient(mongodb_uri), db_name=db_name)
        await saver.setup()
        return saver

    saver = asyncio.run_coroutine_threadsafe(make(), loop).result(30)
    try:
        graph = two_step_graph(saver)
        cfg = config()
        assert graph.invoke({"foo": "", "bar": []}, cfg) == {"foo": "b", "bar": ["a", "b"]}
        assert [s.metadata["step"] for s in graph.get_state_history(cfg)] == [2, 1, 0, -1]

        async def blocking_call_on_the_loop() -> None:
            saver.get_tuple(cfg)

        with pytest.raises(MongoSaverError, match="another thread"):
            asyncio.run_coroutine_threadsafe(blocking_call_on_the_loop(), loop).result(30)
    finally:
        asyncio.run_coroutine_threadsafe(saver.client.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)


def test_close_never_closes_a_client_the_caller_owns(mongodb_uri: str, db_name: str) -> None:
    from pymongo import MongoClient
    from pymongo.errors import InvalidOperation

    from mongo_saver import MongoSaver

    client: MongoClient[Any] = MongoClient(mongodb_uri)
    try:
        MongoSaver(client, db_name=db_name).close()
        client.admin.command("ping")  # still open
    finally:
        client.close()
    with MongoSaver.from_conn_string(mongodb_uri, db_name=db_name) as owned:
        owned.setup()
    with pytest.raises(InvalidOperation):
        owned.client.admin.command("ping")  # the saver closed the client it opened
