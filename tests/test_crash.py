"""Crash safety: a run killed with SIGKILL at a random point resumes to the same result.

Each trial starts the six-step graph of `ops_workers` in a child process, kills it with
SIGKILL at a random moment of its run, then lets a fresh process resume the thread with
`invoke(None, config)` (or start it, if the kill came before the first checkpoint). The
thread must end in exactly the state, checkpoint count and single linear chain of an
uninterrupted run. 30 trials by default; `pytest -m soak tests/test_crash.py` runs 300.
Set `MS_CRASH_SEED` to replay a sequence of kill times.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import time
from typing import Any

import ops_workers
import pytest
from ops_workers import crash_graph, forkserver

from mongo_saver import MongoSaver


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


def _run_child(ctx: Any, uri: str, db: str, thread_id: str, ready: Any = None) -> Any:
    child = ctx.Process(target=ops_workers.run_or_resume, args=(uri, db, thread_id, ready))
    child.start()
    return child


def _crash_trials(saver: MongoSaver, uri: str, trials: int) -> None:
    ctx = forkserver()
    db = saver.db_name
    seed = int(os.environ.get("MS_CRASH_SEED", random.randrange(2**32)))
    rng = random.Random(seed)

    # The uninterrupted run: its result, its checkpoint count and its duration in a child.
    ready = ctx.Event()
    started = time.monotonic()
    child = _run_child(ctx, uri, db, "baseline", ready)
    assert ready.wait(60)
    ready_at = time.monotonic()
    child.join(60)
    run_time = time.monotonic() - ready_at
    assert child.exitcode == 0, f"uninterrupted run failed ({time.monotonic() - started:.2f}s)"
    graph = crash_graph(saver)
    expected = graph.get_state(_config("baseline"))
    assert expected.next == ()
    expected_count = len(list(saver.list(_config("baseline"))))

    stored_at_kill: collections.Counter[int] = collections.Counter()
    orphan_trials = 0
    for trial in range(trials):
        thread_id = f"trial-{trial}"
        ready = ctx.Event()
        child = _run_child(ctx, uri, db, thread_id, ready)
        assert ready.wait(60)
        time.sleep(rng.uniform(0, run_time))
        child.kill()
        child.join(30)
        assert child.exitcode in (0, -signal.SIGKILL)
        stored_at_kill[len(list(saver.list(_config(thread_id))))] += 1

        resume = _run_child(ctx, uri, db, thread_id)
        resume.join(60)
        assert resume.exitcode == 0, f"trial {trial} (seed {seed}): resume failed"

        state = graph.get_state(_config(thread_id))
        where = f"trial {trial} (seed {seed})"
        assert state.values == expected.values, where
        assert state.next == (), where
        assert len(list(saver.list(_config(thread_id)))) == expected_count, where
        report = saver.check_integrity([thread_id])
        # With LangGraph's default "async" durability a task's writes can reach the
        # database before its checkpoint does; a kill in between leaves writes whose
        # checkpoint never landed. They are never read (the resume re-runs that step
        # from the last stored checkpoint), and `check --repair` removes them.
        harmful = [f for f in report.findings if f.kind != "orphan_write"]
        assert not harmful and not report.forks, (where, report.findings)
        orphan_trials += bool(report.of("orphan_write"))
    print(f"\ncrash trials: {trials} ({orphan_trials} left orphan writes), seed {seed}, "
          f"run {run_time * 1000:.0f} ms; "
          f"checkpoints stored when killed (of {expected_count}): "
          f"{dict(sorted(stored_at_kill.items()))}")
    # The kills must land inside runs, not only before or after them.
    assert len([n for n in stored_at_kill if 0 < n < expected_count]) >= min(3, trials // 10)


def test_sigkill_then_resume(saver: MongoSaver, mongodb_uri: str) -> None:
    _crash_trials(saver, mongodb_uri, trials=30)


@pytest.mark.soak
def test_sigkill_then_resume_soak(saver: MongoSaver, mongodb_uri: str) -> None:
    _crash_trials(saver, mongodb_uri, trials=int(os.environ.get("MS_CRASH_TRIALS", "300")))
