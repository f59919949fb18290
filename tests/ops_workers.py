"""Graphs and child-process entry points for the operations-safety and crash tests.

Children are started through a `forkserver` context that preloads this module, so a
child starts in milliseconds (no re-import of LangGraph) and opens its own client. Every
function here is module-level, so it can be handed to a child process.
"""

from __future__ import annotations

import multiprocessing
import operator
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (str(REPO_ROOT), str(REPO_ROOT / "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from langgraph.graph import END, START, StateGraph  # noqa: E402
from pymongo import MongoClient  # noqa: E402

from mongo_saver import MongoSaver  # noqa: E402

_CONTEXT: Any = None


def forkserver() -> Any:
    """The multiprocessing context for every child of these tests (one fork server)."""
    global _CONTEXT
    if _CONTEXT is None:
        # The fork server is a fresh interpreter that does not receive our sys.path
        # (Python 3.11 ignores it); without this its preload fails silently and every
        # child re-imports LangGraph (~0.6 s).
        paths = [str(REPO_ROOT), str(REPO_ROOT / "tests")]
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *([old] if old else [])])
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["ops_workers"])
    return _CONTEXT


def _saver(uri: str, db: str) -> tuple[MongoClient[Any], MongoSaver]:
    client: MongoClient[Any] = MongoClient(uri, serverSelectionTimeoutMS=15_000)
    return client, MongoSaver(client, db)


# --- a six-step graph whose result depends on the order its steps ran in ---------------

CRASH_NODES = 6
CRASH_INPUT = {"steps": ["input"], "total": 1}


class CrashState(TypedDict):
    steps: Annotated[list[str], operator.add]
    total: int


def crash_graph(checkpointer: Any, pause: float = 0.005) -> Any:
    builder = StateGraph(CrashState)
    previous = START
    for i in range(CRASH_NODES):
        name = f"step_{i}"

        def node(state: CrashState, i: int = i, name: str = name) -> dict[str, Any]:
            time.sleep(pause)
            return {"steps": [name], "total": state["total"] * 3 + i}

        builder.add_node(name, node)
        builder.add_edge(previous, name)
        previous = name
    builder.add_edge(previous, END)
    return builder.compile(checkpointer=checkpointer)


def run_or_resume(uri: str, db: str, thread_id: str, ready: Any = None) -> None:
    """Start the crash graph on a fresh thread, or resume it with `invoke(None)`."""
    client, saver = _saver(uri, db)
    try:
        graph = crash_graph(saver)
        config = {"configurable": {"thread_id": thread_id}}
        started = saver.get_tuple(config) is not None
        if ready is not None:
            ready.set()
        graph.invoke(None if started else dict(CRASH_INPUT), config)
    finally:
        client.close()


# --- a three-node graph that many runs share one thread of ---------------------------


class RaceState(TypedDict):
    log: Annotated[list[str], operator.add]


RACE_NODES = ("a", "b", "c")


def race_graph(checkpointer: Any, pause: float = 0.01) -> Any:
    builder = StateGraph(RaceState)
    previous = START
    for name in RACE_NODES:

        def node(state: RaceState, name: str = name) -> dict[str, Any]:
            time.sleep(pause)
            return {"log": [name]}

        builder.add_node(name, node)
        builder.add_edge(previous, name)
        previous = name
    builder.add_edge(previous, END)
    return builder.compile(checkpointer=checkpointer)


# --- lease holders --------------------------------------------------------------------


def hold_lease(
    uri: str, db: str, thread_id: str, rounds: int, hold: float, out: str, barrier: Any
) -> None:
    """Take the thread's lease `rounds` times; append `token start end` per holding."""
    client, saver = _saver(uri, db)
    try:
        barrier.wait()
        for _ in range(rounds):
            with saver.lease(thread_id, ttl=10, timeout=60) as lease:
                start = time.time()
                time.sleep(hold)
                end = time.time()
                with open(out, "a") as log:
                    log.write(f"{lease.token} {start!r} {end!r}\n")
    finally:
        client.close()


def hold_forever(uri: str, db: str, thread_id: str, ttl: float, tokens: Any) -> None:
    """Take the lease, report its token, then hang until killed."""
    client, saver = _saver(uri, db)
    lease = saver.lease(thread_id, ttl=ttl, timeout=30)
    with lease:
        tokens.put(lease.token)
        time.sleep(3600)
    client.close()


def call_setup(uri: str, db: str, barrier: Any) -> None:
    client, saver = _saver(uri, db)
    try:
        barrier.wait()
        saver.setup()
    finally:
        client.close()
