"""Restart safety: the server stops and starts again in the middle of a run.

A dedicated **on-disk** test server (SecantusDB's WiredTiger directory, or mongoeco's SQLite
engine) is started for this module, so its data survives `RunningServer.restart()`, which
keeps the port and the storage path. An eight-step graph runs with `MongoSaver` (in a
background thread) or `AsyncMongoSaver` (on its own event loop in a background thread)
while the main thread stops the server, waits, and starts it again:

* ``down``: the run is held at step 2 until the server process has exited, so its next
  write is certain to find no server; the client waits for it (server selection) and
  retries;
* ``in-flight``: the server gets SIGTERM the moment step 2 starts while the run goes on,
  so the shutdown races with the run's reads and writes.

The run either completes by itself (pymongo reconnects and retries) or raises; then a
fresh client resumes it with `invoke(None, config)`. Either way the thread must end with
the final state of an uninterrupted run, the same checkpoints (the sequence of
`metadata.step` values, each `checkpoint_id` once), and a linear integrity report that is
clean, except that a run which raised may leave orphan pending writes (see the comment in
`_restart_during_run`): they must lie off the chain, and after `repair=True` it is clean.

Skipped when `MONGODB_URI` is set: an external server cannot be restarted from here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import operator
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from pymongo import AsyncMongoClient, MongoClient, monitoring
from servers import RunningServer, start_server

from mongo_saver import AsyncMongoSaver, MongoSaver
from mongo_saver.integrity import IntegrityReport

pytestmark = pytest.mark.timeout(180)

NODES = 8
PAUSE = 0.05
"""Seconds each node sleeps: the run lasts about half a second without a restart."""
GATE_STEP = 2
"""Index of the node at which the main thread takes the server down."""
DOWN_FOR = 1.0
"""Seconds the server stays down (after its process has exited) before it starts again."""
SELECTION_TIMEOUT_MS = 20_000
"""Long enough for the run's client to wait out the whole restart."""
INPUT = {"steps": ["input"], "total": 1}
MODES = ("down", "in-flight")


# --- the server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(server_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server of this session's kind, on disk, for this module only."""
    if server_kind == "external":
        pytest.skip("MONGODB_URI is set: an external server cannot be stopped and restarted "
                    "by the tests; the restart test needs a local on-disk test server")
    storage = tmp_path_factory.mktemp(f"restart-{server_kind}")
    running = start_server(server_kind, storage_path=str(storage))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def uri(server: RunningServer) -> str:
    # retryWrites=true, unlike every other test URI (TESTING.md turns it off because
    # SecantusDB slows down after ~10,000 retryable writes; this module writes a few hundred
    # on a fresh server). Retryable writes are what lets a checkpoint write survive a
    # failover or restart on real MongoDB, so they are what this test must exercise.
    return f"mongodb://{server.host}:{server.port}/?directConnection=true&retryWrites=true"


# --- the graph ----------------------------------------------------------------------------


class State(TypedDict):
    steps: Annotated[list[str], operator.add]
    total: int


@dataclass
class Gate:
    """Lets the main thread act when the run reaches node `GATE_STEP`.

    `blocking` holds the node there until `release` is set (mode ``down``)."""

    blocking: bool
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def passed(self) -> None:
        self.reached.set()
        if self.blocking:
            assert self.release.wait(60), "the gate was never released"


def _update(state: State, i: int) -> dict[str, Any]:
    # The total depends on the order the steps ran in: a step run twice or skipped shows.
    return {"steps": [f"step_{i}"], "total": state["total"] * 3 + i}


def _graph(checkpointer: Any, gate: Gate | None, *, is_async: bool) -> Any:
    builder = StateGraph(State)
    previous = START
    for i in range(NODES):
        name = f"step_{i}"
        node_gate = gate if i == GATE_STEP else None

        if is_async:

            async def anode(state: State, i: int = i, g: Gate | None = node_gate) -> Any:
                if g is not None:
                    await asyncio.to_thread(g.passed)
                await asyncio.sleep(PAUSE)
                return _update(state, i)

            builder.add_node(name, anode)
        else:

            def node(state: State, i: int = i, g: Gate | None = node_gate) -> Any:
                if g is not None:
                    g.passed()
                time.sleep(PAUSE)
                return _update(state, i)

            builder.add_node(name, node)
        builder.add_edge(previous, name)
        previous = name
    builder.add_edge(previous, END)
    return builder.compile(checkpointer=checkpointer)


# --- what pymongo saw ----------------------------------------------------------------------


class Commands(monitoring.CommandListener):
    """Counts commands that failed and writes pymongo sent again (same session and txnNumber)."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.retries: list[str] = []
        self._writes: set[tuple[bytes, int]] = set()
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        txn, lsid = event.command.get("txnNumber"), event.command.get("lsid")
        if txn is None or lsid is None:
            return
        key = (bytes(lsid["id"]), int(txn))
        with self._lock:
            if key in self._writes:
                self.retries.append(event.command_name)
            self._writes.add(key)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        with self._lock:
            message = str(event.failure.get("errmsg", event.failure)).split(" (configured")[0]
            self.failures.append(f"{event.command_name}: {message}")


# --- what a thread ends with ----------------------------------------------------------------


@dataclass
class ThreadSummary:
    values: dict[str, Any]
    next: tuple[str, ...]
    steps: list[int]
    """`metadata.step` of each checkpoint, newest first, as `list()` returns them."""
    ids: list[str]
    report: IntegrityReport


def _config(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}


def _sync_client(uri: str, listener: Commands | None = None) -> MongoClient[Any]:
    return MongoClient(uri, serverSelectionTimeoutMS=SELECTION_TIMEOUT_MS,
                       event_listeners=[listener] if listener else [])


def _async_client(uri: str, listener: Commands | None = None) -> AsyncMongoClient[Any]:
    return AsyncMongoClient(uri, serverSelectionTimeoutMS=SELECTION_TIMEOUT_MS,
                            event_listeners=[listener] if listener else [])


def _sync_run(uri: str, db: str, thread_id: str, *, resume: bool = False,
              gate: Gate | None = None, listener: Commands | None = None) -> None:
    client = _sync_client(uri, listener)
    try:
        saver = MongoSaver(client, db)
        _graph(saver, gate, is_async=False).invoke(None if resume else dict(INPUT),
                                                   _config(thread_id))
    finally:
        client.close()


def _async_run(uri: str, db: str, thread_id: str, *, resume: bool = False,
               gate: Gate | None = None, listener: Commands | None = None) -> None:
    async def run() -> None:
        client = _async_client(uri, listener)
        try:
            saver = AsyncMongoSaver(client, db)
            graph = _graph(saver, gate, is_async=True)
            await graph.ainvoke(None if resume else dict(INPUT), _config(thread_id))
        finally:
            await client.close()

    asyncio.run(run())


def _sync_thread(uri: str, db: str, thread_id: str, repair: bool = False) -> ThreadSummary:
    client = _sync_client(uri)
    try:
        saver = MongoSaver(client, db)
        if repair:
            saver.check_integrity([thread_id], repair=True, repair_grace=dt.timedelta(0))
        state = _graph(saver, None, is_async=False).get_state(_config(thread_id))
        tuples = list(saver.list(_config(thread_id)))
        return ThreadSummary(
            values=state.values,
            next=tuple(state.next),
            steps=[t.metadata["step"] for t in tuples],
            ids=[t.checkpoint["id"] for t in tuples],
            report=saver.check_integrity([thread_id]),
        )
    finally:
        client.close()


def _async_thread(uri: str, db: str, thread_id: str, repair: bool = False) -> ThreadSummary:
    async def read() -> ThreadSummary:
        client = _async_client(uri)
        try:
            saver = AsyncMongoSaver(client, db)
            if repair:
                await saver.check_integrity([thread_id], repair=True,
                                            repair_grace=dt.timedelta(0))
            state = await _graph(saver, None, is_async=True).aget_state(_config(thread_id))
            tuples = [t async for t in saver.alist(_config(thread_id))]
            return ThreadSummary(
                values=state.values,
                next=tuple(state.next),
                steps=[t.metadata["step"] for t in tuples],
                ids=[t.checkpoint["id"] for t in tuples],
                report=await saver.check_integrity([thread_id]),
            )
        finally:
            await client.close()

    return asyncio.run(read())


# --- the scenario ---------------------------------------------------------------------------


def _restart_during_run(
    server: RunningServer,
    uri: str,
    db: str,
    mode: str,
    run: Callable[..., None],
    read: Callable[..., ThreadSummary],
    label: str,
) -> None:
    # Setup, and an uninterrupted run on the same server: the expected result.
    if run is _sync_run:
        client = _sync_client(uri)
        try:
            MongoSaver(client, db).setup()
        finally:
            client.close()
    else:
        async def setup() -> None:
            client = _async_client(uri)
            try:
                await AsyncMongoSaver(client, db).setup()
            finally:
                await client.close()

        asyncio.run(setup())
    run(uri, db, "baseline")
    expected = read(uri, db, "baseline")
    assert expected.next == ()
    assert expected.report.linear, expected.report.findings
    assert expected.steps == list(range(NODES, -2, -1)), expected.steps

    # The same run, with the server stopped and started again in its middle.
    gate = Gate(blocking=mode == "down")
    listener = Commands()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            run(uri, db, "restarted", gate=gate, listener=listener)
        except BaseException as error:
            errors.append(error)

    worker = threading.Thread(target=work, name=f"restart-{label}", daemon=True)
    worker.start()
    assert gate.reached.wait(60), "the run never reached the gate step"
    started_down = time.monotonic()
    server.stop()  # SIGTERM, and wait until the process has exited
    running_when_down = worker.is_alive()
    gate.release.set()
    time.sleep(DOWN_FOR)
    server.restart()  # same port, same storage directory
    downtime = time.monotonic() - started_down
    worker.join(SELECTION_TIMEOUT_MS / 1000 + 30)
    assert not worker.is_alive(), "the run hung after the restart"
    assert running_when_down, "the run ended before the server went down: nothing was tested"

    # The data written before the restart is still there (on-disk storage).
    assert read(uri, db, "baseline") == expected

    if errors:
        message = str(errors[0]).split(" (configured")[0][:120]
        outcome = f"raised {type(errors[0]).__name__}: {message}; resumed"
        run(uri, db, "restarted", resume=True)
    else:
        outcome = "completed by itself"
    got = read(uri, db, "restarted")
    print(f"\nrestart [{server.kind}, {label}, {mode}]: server down {downtime:.1f} s; run "
          f"{outcome}; {len(listener.failures)} failed commands {listener.failures[:2]}, "
          f"{len(listener.retries)} retried writes {listener.retries[:4]}; after it: "
          f"{got.report.summary()}")

    where = f"{label}, {mode}: run {outcome}; checkpoint steps {got.steps}"
    assert got.values == expected.values, where
    assert got.next == (), where
    # No checkpoint lost, none written twice.
    assert got.steps == expected.steps, where
    assert len(set(got.ids)) == len(got.ids), got.ids
    assert {f.kind for f in got.report.findings} <= {"orphan_write"}, got.report.findings
    if errors:
        # With LangGraph's default durability ("async") a failed checkpoint save does not
        # stop the run: the later saves of that run fail too (each waits for the one
        # before), but its tasks' pending writes are still saved, against checkpoints
        # that never exist. The resume runs those steps again under new checkpoint ids,
        # so the leftovers are unreadable orphans: the integrity check must name them,
        # they must lie off the final chain, and repair must remove them.
        assert all(f.checkpoint_id not in got.ids for f in got.report.orphan_writes)
        got = read(uri, db, "restarted", repair=True)
        assert got.values == expected.values
        assert got.steps == expected.steps
    assert got.report.clean, got.report.findings
    assert got.report.linear, got.report.findings  # a duplicate would show as a fork


@pytest.mark.parametrize("mode", MODES)
def test_sync_run_survives_restart(server: RunningServer, uri: str, db_name: str,
                                   mode: str) -> None:
    _restart_during_run(server, uri, db_name, mode, _sync_run, _sync_thread, "sync")


@pytest.mark.parametrize("mode", MODES)
def test_async_run_survives_restart(server: RunningServer, uri: str, db_name: str,
                                    mode: str) -> None:
    _restart_during_run(server, uri, db_name, mode, _async_run, _async_thread, "async")


def test_storage_is_on_disk(server: RunningServer) -> None:
    assert server.storage_path is not None and Path(server.storage_path).is_dir()
    assert any(Path(server.storage_path).iterdir()), "the server wrote nothing to disk"
