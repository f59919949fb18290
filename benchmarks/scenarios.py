"""The measured scenarios. Each takes a :class:`~benchmarks.savers.SaverHandle`.

Scenarios that only call saver methods are coroutines that work for every saver (a sync
saver's blocking methods are called directly, an async saver's awaited). The chat runs a
compiled graph and has a sync and an async driver.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver

from benchmarks.graphs import ai, chat_graph, messages, turn_input
from benchmarks.monitor import Usage, measure
from benchmarks.savers import MEMORY, SaverHandle

USAGE_FIELDS = ("round_trips", "bytes_sent", "bytes_received", "cpu_s", "wall_s")


async def call(handle: SaverHandle, name: str, *args: Any, **kwargs: Any) -> Any:
    """``saver.name(...)`` for a sync saver, ``await saver.aname(...)`` for an async one."""
    if handle.is_async:
        return await getattr(handle.saver, "a" + name)(*args, **kwargs)
    return getattr(handle.saver, name)(*args, **kwargs)


async def list_tuples(handle: SaverHandle, config: Any, **kwargs: Any) -> list[CheckpointTuple]:
    if handle.is_async:
        return [t async for t in handle.saver.alist(config, **kwargs)]
    return list(handle.saver.list(config, **kwargs))


def summarize(samples: Sequence[Usage]) -> dict[str, Any]:
    """Means of every field, the worst round-trip count, and the commands of one sample."""
    out: dict[str, Any] = {f: statistics.fmean(getattr(s, f) for s in samples)
                           for f in USAGE_FIELDS}
    out["round_trips_max"] = max(s.round_trips for s in samples)
    out["round_trips_min"] = min(s.round_trips for s in samples)
    out["samples"] = len(samples)
    out["commands"] = samples[-1].commands
    return out


def _thread(thread_id: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


# --- single operations at 10 / 100 / 1,000 messages --------------------------------------


async def operations(handle: SaverHandle, sizes: Sequence[int], reps: int) -> dict[str, Any]:
    """put (full state of n messages), put_writes, put (append 2), get_tuple latest / by id."""
    saver, counter = handle.saver, handle.counter
    results: dict[str, Any] = {}
    for n in sizes:
        samples: dict[str, list[Usage]] = defaultdict(list)
        state = messages(n + 2)
        for rep in range(reps):
            thread_id = f"ops-{n}-{rep}"
            first = empty_checkpoint()
            v1 = saver.get_next_version(None, None)
            first["channel_values"] = {"messages": state[:n]}
            first["channel_versions"] = {"messages": v1}
            meta: dict[str, Any] = {"source": "loop", "step": 0, "parents": {}}
            with measure(counter) as m:
                config1 = await call(handle, "put", _thread(thread_id), first, meta,
                                     {"messages": v1})
            samples["put"].append(m.usage)

            with measure(counter) as m:
                await call(handle, "put_writes", config1,
                           [("messages", [ai(n)])], "task-1")
            samples["put_writes"].append(m.usage)

            second = empty_checkpoint()
            v2 = saver.get_next_version(v1, None)
            second["channel_values"] = {"messages": state}
            second["channel_versions"] = {"messages": v2}
            with measure(counter) as m:
                await call(handle, "put", config1, second, {**meta, "step": 1},
                           {"messages": v2})
            samples["put_append"].append(m.usage)

            with measure(counter) as m:
                latest = await call(handle, "get_tuple", _thread(thread_id))
            samples["get_tuple_latest"].append(m.usage)
            assert latest is not None and len(latest.checkpoint["channel_values"]
                                              ["messages"]) == n + 2, "wrong latest state"

            with measure(counter) as m:
                by_id = await call(handle, "get_tuple", config1)
            samples["get_tuple_by_id"].append(m.usage)
            assert by_id is not None and len(by_id.checkpoint["channel_values"]
                                             ["messages"]) == n, "wrong state by id"
            assert len(by_id.pending_writes or []) == 1, "pending write missing"
        results[str(n)] = {op: summarize(s) for op, s in samples.items()}
    return results


# --- replaying a recorded thread into a saver ------------------------------------------------


async def replay(handle: SaverHandle, source: InMemorySaver, source_thread: str,
                 thread_id: str) -> list[str]:
    """Write every checkpoint and pending write of ``source_thread`` into ``handle``'s saver,
    oldest first, through put/put_writes exactly as a graph would; return the checkpoint
    ids oldest first."""
    tuples = list(source.list({"configurable": {"thread_id": source_thread}}))[::-1]
    versions_by_id: dict[str, dict[str, Any]] = {}
    ids: list[str] = []
    for t in tuples:
        parent_id = (t.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        versions = t.checkpoint["channel_versions"]
        parent_versions = versions_by_id.get(parent_id, {}) if parent_id else {}
        new_versions = {k: v for k, v in versions.items() if parent_versions.get(k) != v}
        saved = await call(handle, "put", _thread(thread_id, parent_id), t.checkpoint,
                           t.metadata, new_versions)
        by_task: dict[str, list[tuple[str, Any]]] = defaultdict(list)
        for task_id, channel, value in t.pending_writes or []:
            by_task[task_id].append((channel, value))
        for task_id, writes in by_task.items():
            await call(handle, "put_writes", saved, writes, task_id)
        versions_by_id[t.checkpoint["id"]] = dict(versions)
        ids.append(t.checkpoint["id"])
    return ids


def record_thread(graph_builder: Any, turns: int, make_input: Any,
                  thread_id: str = "source") -> InMemorySaver:
    """Run ``turns`` turns of a graph on an `InMemorySaver` to get a thread to replay."""
    source = InMemorySaver()
    app = graph_builder.compile(checkpointer=source)
    config = _thread(thread_id)
    for turn in range(turns):
        app.invoke(make_input(turn), config)
    return source


# --- list(limit=10) over a long thread ----------------------------------------------------


async def listing(handle: SaverHandle, source: InMemorySaver, reps: int) -> dict[str, Any]:
    ids = await replay(handle, source, "source", "listed")
    config = {"configurable": {"thread_id": "listed"}}
    samples: dict[str, list[Usage]] = defaultdict(list)
    for _ in range(reps):
        with measure(handle.counter) as m:
            page = await list_tuples(handle, config, limit=10)
        assert [t.checkpoint["id"] for t in page] == ids[::-1][:10], "wrong page"
        samples["list_limit_10"].append(m.usage)
    with measure(handle.counter) as m:
        everything = await list_tuples(handle, config)
    assert len(everything) == len(ids), "list() lost checkpoints"
    samples["list_all"].append(m.usage)
    out = {op: summarize(s) for op, s in samples.items()}
    out["checkpoints"] = len(ids)
    return out


# --- DeltaChannel history at depth ---------------------------------------------------------


async def delta_history(handle: SaverHandle, source: InMemorySaver,
                        depths: Sequence[int], reps: int) -> dict[str, Any]:
    ids = await replay(handle, source, "source", "delta")
    out: dict[str, Any] = {"thread_checkpoints": len(ids)}
    for depth in depths:
        if depth > len(ids):
            continue
        target = ids[depth - 1]
        expected = source.get_delta_channel_history(
            config=_thread("source", target), channels=["messages"])["messages"]
        samples: list[Usage] = []
        got: Any = None
        for _ in range(reps):
            with measure(handle.counter) as m:
                got = (await call(handle, "get_delta_channel_history",
                                  config=_thread("delta", target),
                                  channels=["messages"]))["messages"]
            samples.append(m.usage)
        entry = summarize(samples)
        entry["writes_returned"] = len(got["writes"])
        entry["writes_expected"] = len(expected["writes"])
        entry["seed_returned"] = "seed" in got
        entry["seed_expected"] = "seed" in expected
        entry["matches_in_memory"] = (
            [w[2] for w in got["writes"]] == [w[2] for w in expected["writes"]]
            and ("seed" in got) == ("seed" in expected)
        )
        out[str(depth)] = entry
    return out


# --- the chat --------------------------------------------------------------------------------


class ChatRecorder:
    """Per-turn usage of a chat, plus bytes stored at chosen turns."""

    def __init__(self, handle: SaverHandle, stored_at: Sequence[int]) -> None:
        self.handle = handle
        self.stored_at = set(stored_at)
        self.per_turn: dict[str, list[float]] = {f: [] for f in USAGE_FIELDS}
        self.per_turn["bytes_written"] = []
        self.stored: dict[str, Any] = {}
        self._memory_total = 0

    def record(self, turn: int, usage: Usage) -> None:
        for f in USAGE_FIELDS:
            self.per_turn[f].append(getattr(usage, f))
        if self.handle.kind == MEMORY:
            total = self.handle.sizer.refresh()  # type: ignore[attr-defined]
            self.per_turn["bytes_written"].append(total - self._memory_total)
            self._memory_total = total
        else:
            self.per_turn["bytes_written"].append(usage.bytes_sent)
        if turn in self.stored_at:
            self.stored[str(turn)] = self.handle.bytes_stored()

    def result(self, turns: int, final_messages: int) -> dict[str, Any]:
        return {
            "turns": turns,
            "final_messages": final_messages,
            "per_turn": self.per_turn,
            "stored": self.stored,
            "stored_final": self.handle.bytes_stored(),
        }


def chat_sync(handle: SaverHandle, turns: int, *, delta: bool, stored_at: Sequence[int],
              snapshot_frequency: int = 100) -> dict[str, Any]:
    app = chat_graph(delta=delta, snapshot_frequency=snapshot_frequency).compile(
        checkpointer=handle.saver)
    config = _thread("chat")
    recorder = ChatRecorder(handle, stored_at)
    for turn in range(turns):
        with measure(handle.counter) as m:
            app.invoke(turn_input(turn), config)
        recorder.record(turn + 1, m.usage)
    final = len(app.get_state(config).values["messages"])
    assert final == 2 * turns, f"chat state has {final} messages after {turns} turns"
    return recorder.result(turns, final)


async def chat_async(handle: SaverHandle, turns: int, *, delta: bool,
                     stored_at: Sequence[int], snapshot_frequency: int = 100) -> dict[str, Any]:
    app = chat_graph(delta=delta, snapshot_frequency=snapshot_frequency).compile(
        checkpointer=handle.saver)
    config = _thread("chat")
    recorder = ChatRecorder(handle, stored_at)
    for turn in range(turns):
        with measure(handle.counter) as m:
            await app.ainvoke(turn_input(turn), config)
        recorder.record(turn + 1, m.usage)
    final = len((await app.aget_state(config)).values["messages"])
    assert final == 2 * turns, f"chat state has {final} messages after {turns} turns"
    return recorder.result(turns, final)


# --- many threads at once ----------------------------------------------------------------------


async def concurrent_chats(handle: SaverHandle, threads: int, turns: int) -> dict[str, Any]:
    app = chat_graph().compile(checkpointer=handle.saver)

    async def one(index: int) -> int:
        config = _thread(f"conc-{index}")
        for turn in range(turns):
            await app.ainvoke(turn_input(turn), config)
        return len((await app.aget_state(config)).values["messages"])

    with measure(handle.counter) as m:
        finals = await asyncio.gather(*(one(i) for i in range(threads)))
    assert all(f == 2 * turns for f in finals), "a concurrent thread lost messages"
    total_turns = threads * turns
    usage = m.usage
    return {
        "threads": threads,
        "turns_per_thread": turns,
        "total": usage.to_dict(),
        "turns_per_s": total_turns / usage.wall_s if usage.wall_s else None,
        "per_turn": {f: getattr(usage, f) / total_turns for f in USAGE_FIELDS},
        "stored": handle.bytes_stored(),
    }


# --- decile statistics ---------------------------------------------------------------------------


def deciles(values: Sequence[float]) -> list[float]:
    """Mean of each tenth of ``values`` (fewer groups when there are fewer than 10)."""
    n = len(values)
    if n == 0:
        return []
    groups = min(10, n)
    return [statistics.fmean(values[i * n // groups:(i + 1) * n // groups])
            for i in range(groups)]


def decile_growth(values: Sequence[float]) -> float | None:
    d = deciles(values)
    if not d or d[0] == 0:
        return None
    return d[-1] / d[0]

