"""Production safety over the wire: leases, races, cold start, bad input, security."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import logging
import pickle
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ops_workers
import pytest
from ops_workers import RACE_NODES, forkserver, race_graph
from pymongo import AsyncMongoClient, MongoClient

from mongo_saver import (
    AsyncMongoSaver,
    CorruptDocumentError,
    InvalidInputError,
    LeaseError,
    MongoSaver,
    SchemaVersionError,
)


def _config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


def _counts(client: MongoClient[Any], db: str) -> tuple[int, int]:
    return (client[db].checkpoints.count_documents({}),
            client[db].checkpoint_writes.count_documents({}))


# =========================================================================================
# Leases
# =========================================================================================


@pytest.mark.parametrize("workers", [2, 4, 8])
def test_lease_excludes_threads(saver: MongoSaver, workers: int) -> None:
    inside = 0
    most_inside = 0
    held: list[tuple[int, float, float]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(workers)
    errors: list[BaseException] = []

    def work() -> None:
        nonlocal inside, most_inside
        try:
            barrier.wait()
            for _ in range(3):
                with saver.lease("shared", ttl=5, timeout=60) as lease:
                    start = time.monotonic()
                    with lock:
                        inside += 1
                        most_inside = max(most_inside, inside)
                    time.sleep(0.01)
                    lease.check()
                    with lock:
                        inside -= 1
                    held.append((lease.token, start, time.monotonic()))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert most_inside == 1
    held.sort(key=lambda h: h[1])
    tokens = [h[0] for h in held]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens) == 3 * workers
    for (_, _, end), (_, start, _) in itertools.pairwise(held):
        assert end <= start


def test_lease_excludes_processes(saver: MongoSaver, mongodb_uri: str, tmp_path: Path) -> None:
    ctx = forkserver()
    procs = 4
    barrier = ctx.Barrier(procs)
    outs = [tmp_path / f"holder-{i}.log" for i in range(procs)]
    children = [
        ctx.Process(target=ops_workers.hold_lease,
                    args=(mongodb_uri, saver.db_name, "shared", 3, 0.02, str(out), barrier))
        for out in outs
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
    assert [c.exitcode for c in children] == [0] * procs
    held = sorted(
        (float(start), float(end), int(token))
        for out in outs
        for token, start, end in (line.split() for line in out.read_text().splitlines())
    )
    assert len(held) == 3 * procs
    for (_, end, token), (start, _, next_token) in itertools.pairwise(held):
        assert end <= start, "two processes held the lease at once"
        assert next_token > token, "fencing tokens must grow with every holder"


def test_dead_holders_lease_expires(saver: MongoSaver, mongodb_uri: str) -> None:
    ctx = forkserver()
    tokens = ctx.Queue()
    child = ctx.Process(target=ops_workers.hold_forever,
                        args=(mongodb_uri, saver.db_name, "orphaned", 1.5, tokens))
    child.start()
    try:
        dead_token = tokens.get(timeout=60)
        child.kill()  # SIGKILL: no release, no more renewals
        child.join(10)
        with pytest.raises(LeaseError, match="gave up"), saver.lease("orphaned", timeout=0.2):
            pass
        started = time.monotonic()
        with saver.lease("orphaned", ttl=5, timeout=30) as lease:
            waited = time.monotonic() - started
            assert lease.token > dead_token
    finally:
        if child.is_alive():
            child.kill()
    assert waited < 10


def test_expired_holder_cannot_write(saver: MongoSaver, sync_client: MongoClient[Any]) -> None:
    graph = race_graph(saver, pause=0)
    config = _config("fenced")
    graph.invoke({"log": ["first"]}, config)
    before = _counts(sync_client, saver.db_name)
    stale = saver.lease("fenced", ttl=0.5)
    stale.state.renew_interval = 3600  # a holder that stalls (GC pause, SIGSTOP, ...)
    with stale:
        first_token = stale.check()
        time.sleep(0.6)
        with pytest.raises(LeaseError, match="expired"):
            stale.check()
        with pytest.raises(LeaseError):
            graph.invoke({"log": ["late"]}, config)
        assert _counts(sync_client, saver.db_name) == before
        # Another run takes the expired lease over; the stale holder's renewal sees it.
        other = MongoSaver(sync_client, saver.db_name)
        with other.lease("fenced", ttl=5, timeout=5) as fresh:
            assert fresh.token > first_token
            assert not saver._runner.run(stale.state.renew())
            with pytest.raises(LeaseError, match="lost"):
                stale.check()
            race_graph(other, pause=0).invoke({"log": ["second"]}, config)
    # The stale lease is gone; writes without a lease are allowed again.
    graph.invoke({"log": ["third"]}, config)
    log = graph.get_state(config).values["log"]
    assert "late" not in log and log[-4:] == ["third", *RACE_NODES]


def test_lease_validates_input(saver: MongoSaver) -> None:
    with pytest.raises(InvalidInputError):
        saver.lease(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        saver.lease("a\x00b")
    with pytest.raises(LeaseError):
        saver.lease("t", ttl=0)


async def test_async_lease(mongodb_uri: str, db_name: str) -> None:
    client: AsyncMongoClient[Any] = AsyncMongoClient(mongodb_uri)
    saver = AsyncMongoSaver(client, db_name)
    try:
        await saver.setup()
        inside = 0
        tokens: list[int] = []

        async def work() -> None:
            nonlocal inside
            for _ in range(3):
                async with saver.lease("async-shared", ttl=5, timeout=30) as lease:
                    inside += 1
                    assert inside == 1
                    await asyncio.sleep(0.01)
                    tokens.append(lease.check())
                    inside -= 1

        await asyncio.gather(*(work() for _ in range(4)))
        assert tokens == sorted(tokens) and len(set(tokens)) == 12

        stale = saver.lease("async-fenced", ttl=0.4)
        stale.state.renew_interval = 3600
        async with stale:
            await asyncio.sleep(0.5)
            with pytest.raises(LeaseError):
                await saver.aput_writes(
                    {"configurable": {"thread_id": "async-fenced", "checkpoint_id": "x"}},
                    [("c", 1)], "task",
                )
        assert await client[db_name].checkpoint_writes.count_documents({}) == 0
    finally:
        await client.drop_database(db_name)
        await client.close()


# =========================================================================================
# Races: many runs on one thread
# =========================================================================================


def _race(saver: MongoSaver, thread_id: str, workers: int, use_lease: bool) -> None:
    graph = race_graph(saver)
    barrier = threading.Barrier(workers)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            if use_lease:
                with saver.lease(thread_id, ttl=10, timeout=60):
                    graph.invoke({"log": [f"run-{i}"]}, _config(thread_id))
            else:
                graph.invoke({"log": [f"run-{i}"]}, _config(thread_id))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def _checkpoints_per_run(saver: MongoSaver) -> int:
    race_graph(saver, pause=0).invoke({"log": ["solo"]}, _config("solo"))
    return len(list(saver.list(_config("solo"))))


def _chain_length(saver: MongoSaver, thread_id: str) -> int:
    """Checkpoints reachable from the latest one by following parent pointers."""
    by_id = {t.config["configurable"]["checkpoint_id"]: t for t in saver.list(_config(thread_id))}
    latest = saver.get_tuple(_config(thread_id))
    length, current = 0, latest
    while current is not None:
        length += 1
        parent = current.parent_config
        current = by_id.get(parent["configurable"]["checkpoint_id"]) if parent else None
    return length


@pytest.mark.parametrize("workers", [2, 4, 8])
def test_race_with_lease_applies_every_run(saver: MongoSaver, workers: int) -> None:
    per_run = _checkpoints_per_run(saver)
    _race(saver, "raced", workers, use_lease=True)
    log = race_graph(saver).get_state(_config("raced")).values["log"]
    blocks = [log[i : i + 1 + len(RACE_NODES)] for i in range(0, len(log), 1 + len(RACE_NODES))]
    assert sorted(b[0] for b in blocks) == sorted(f"run-{i}" for i in range(workers))
    assert all(b[1:] == list(RACE_NODES) for b in blocks)
    total = len(list(saver.list(_config("raced"))))
    assert total == workers * per_run
    assert _chain_length(saver, "raced") == total, "the parent chain has a hole"
    report = saver.check_integrity(["raced"])
    assert report.linear, report.findings


def test_race_without_lease_is_detected(saver: MongoSaver) -> None:
    workers = 4
    per_run = _checkpoints_per_run(saver)
    _race(saver, "unguarded", workers, use_lease=False)
    log = race_graph(saver).get_state(_config("unguarded")).values["log"]
    applied = {entry for entry in log if entry.startswith("run-")}
    total = len(list(saver.list(_config("unguarded"))))
    report = saver.check_integrity(["unguarded"])
    # Racing runs fork the history; they must never leave holes or missing values.
    assert report.clean, report.findings
    assert total == workers * per_run  # every run's checkpoints were stored
    if report.linear:
        assert len(applied) == workers
        assert _chain_length(saver, "unguarded") == total
    else:
        # Some run started from a checkpoint another run had already moved past: the
        # report names the forks, and the latest state shows what was lost.
        assert report.forks
        assert _chain_length(saver, "unguarded") < total
    print(f"race without lease: {len(report.forks)} forks, "
          f"{len(applied)}/{workers} runs in the latest state")


# =========================================================================================
# Integrity and expiry
# =========================================================================================


def test_integrity_reports_and_repairs(saver: MongoSaver, sync_client: MongoClient[Any]) -> None:
    graph = race_graph(saver, pause=0)
    graph.invoke({"log": ["x"]}, _config("good"))
    graph.invoke({"log": ["x"]}, _config("bad"))
    assert saver.check_integrity().linear
    db = sync_client[saver.db_name]
    checkpoints = list(db.checkpoints.find({"thread_id": "bad"}).sort("checkpoint_id", 1))
    # A hole: delete a checkpoint in the middle of the chain.
    middle = checkpoints[len(checkpoints) // 2]
    db.checkpoints.delete_one({"_id": middle["_id"]})
    middle_writes = db.checkpoint_writes.count_documents(
        {"thread_id": "bad", "checkpoint_id": middle["checkpoint_id"]})
    # An orphan write, old enough to repair.
    db.checkpoint_writes.insert_one({
        "thread_id": "bad", "checkpoint_ns": "", "checkpoint_id": "no-such-checkpoint",
        "task_id": "t", "task_path": "", "idx": 0, "channel": "log",
        "value": {"t": "null", "d": b""}, "format": 1, "schema_version": 1,
        "created_at": dt.datetime.now(dt.UTC) - dt.timedelta(hours=1),
    })
    # A document from the future.
    db.checkpoints.update_one({"_id": checkpoints[-1]["_id"]}, {"$set": {"format": 99}})
    before = _counts(sync_client, saver.db_name)
    report = saver.check_integrity()
    assert _counts(sync_client, saver.db_name) == before, "a check without repair wrote"
    assert report.threads_checked == 2
    assert {f.thread_id for f in report.findings} == {"bad"}
    assert any(f.checkpoint_id != middle["checkpoint_id"] and middle["checkpoint_id"] in f.detail
               for f in report.dangling_parents)
    assert report.missing_values  # values the deleted checkpoint held
    # The deleted checkpoint's own writes are orphans now, and so is the inserted one.
    assert sorted({f.checkpoint_id for f in report.orphan_writes}) == sorted(
        {"no-such-checkpoint", middle["checkpoint_id"]} if middle_writes
        else {"no-such-checkpoint"})
    assert len(report.orphan_writes) == middle_writes + 1
    assert [f.checkpoint_id for f in report.unknown_versions] == [checkpoints[-1]["checkpoint_id"]]
    assert not report.clean
    # Repair only deletes orphan writes older than the grace period: the inserted one.
    repaired = saver.check_integrity(["bad"], repair=True)
    assert [f.checkpoint_id for f in repaired.repaired] == ["no-such-checkpoint"]
    assert db.checkpoint_writes.count_documents({"checkpoint_id": "no-such-checkpoint"}) == 0
    assert _counts(sync_client, saver.db_name) == (before[0], before[1] - 1)
    repaired = saver.check_integrity(["bad"], repair=True, repair_grace=dt.timedelta(0))
    assert len(repaired.repaired) == middle_writes
    assert not saver.check_integrity(["bad"]).orphan_writes
    assert db.checkpoints.count_documents({}) == before[0]


def test_expiry_deletes_idle_threads_whole(saver: MongoSaver,
                                          sync_client: MongoClient[Any]) -> None:
    graph = race_graph(saver, pause=0)
    for thread_id in ("old", "busy", "live"):
        graph.invoke({"log": ["x"]}, _config(thread_id))
    db = sync_client[saver.db_name]
    # Age "old" and "busy" entirely, and "live" except its newest checkpoint.
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    db.checkpoints.update_many({"thread_id": {"$in": ["old", "busy", "live"]}},
                               {"$set": {"created_at": long_ago}})
    newest = db.checkpoints.find_one({"thread_id": "live"}, sort=[("checkpoint_id", -1)])
    assert newest is not None
    db.checkpoints.update_one({"_id": newest["_id"]},
                              {"$set": {"created_at": dt.datetime.now(dt.UTC)}})
    dry = saver.expire_idle_threads(dt.timedelta(days=7), dry_run=True)
    assert sorted(e.thread_id for e in dry.expired) == ["busy", "old"]
    assert db.checkpoints.count_documents({"thread_id": "old"}) > 0
    with saver.lease("busy", ttl=10):
        report = saver.expire_idle_threads(dt.timedelta(days=7))
    assert [e.thread_id for e in report.expired] == ["old"]
    assert report.expired[0].checkpoints_deleted > 0 and report.expired[0].writes_deleted > 0
    assert report.skipped_busy == ["busy"]
    for collection in ("checkpoints", "checkpoint_writes"):
        assert db[collection].count_documents({"thread_id": "old"}) == 0
        assert db[collection].count_documents({"thread_id": "busy"}) > 0
    assert saver.check_integrity(["live"]).linear
    assert graph.get_state(_config("live")).values["log"] == ["x", *RACE_NODES]
    assert [e.thread_id for e in saver.expire_idle_threads(dt.timedelta(days=7)).expired] == [
        "busy"]
    with pytest.raises(InvalidInputError):
        saver.expire_idle_threads(dt.timedelta(0))


# =========================================================================================
# Cold start
# =========================================================================================


def test_cold_start_setup_races(sync_client: MongoClient[Any], mongodb_uri: str,
                                db_name: str) -> None:
    ctx = forkserver()
    procs = 8
    barrier = ctx.Barrier(procs)
    children = [ctx.Process(target=ops_workers.call_setup, args=(mongodb_uri, db_name, barrier))
                for _ in range(procs)]
    try:
        for child in children:
            child.start()
        for child in children:
            child.join(120)
        assert [c.exitcode for c in children] == [0] * procs
        indexes = list(sync_client[db_name].checkpoints.list_indexes())
        keys = {tuple(i["key"]) for i in indexes}
        assert ("thread_id", "checkpoint_ns", "checkpoint_id") in keys
        assert ("created_at",) in keys
    finally:
        sync_client.drop_database(db_name)


# =========================================================================================
# Bad input: a clear error, and nothing touched
# =========================================================================================


def test_bad_input_is_refused(saver: MongoSaver, sync_client: MongoClient[Any]) -> None:
    graph = race_graph(saver, pause=0)
    graph.invoke({"log": ["x"]}, _config("t"))
    before = _counts(sync_client, saver.db_name)
    latest = saver.get_tuple(_config("t"))
    assert latest is not None
    checkpoint, metadata = latest.checkpoint, latest.metadata
    bad_configs: list[Any] = [
        {"configurable": {}},
        {"configurable": {"thread_id": None}},
        {"configurable": {"thread_id": 7}},
        {"configurable": {"thread_id": ["t"]}},
        {"configurable": {"thread_id": {"$ne": ""}}},
        {"configurable": {"thread_id": "t\x00u"}},
        {"configurable": {"thread_id": "t", "checkpoint_ns": "a\x00"}},
        {"configurable": {"thread_id": "t", "checkpoint_id": {"$gt": ""}}},
    ]
    for config in bad_configs:
        with pytest.raises(InvalidInputError):
            saver.get_tuple(config)
        with pytest.raises(InvalidInputError):
            saver.put(config, checkpoint, metadata, {})
        with pytest.raises(InvalidInputError):
            saver.put_writes({"configurable": {"checkpoint_id": "c",
                                               **config["configurable"]}},
                             [("log", 1)], "task")
    for filter in [{"$where": "sleep(1000)"}, {"source": {"$ne": "x"}},
                   {"a.$b": 1}, {"step": {"$gt": -1}}, {"key\x00": 1}, {"": 1}]:
        with pytest.raises(InvalidInputError):
            list(saver.list(None, filter=filter))
    with pytest.raises(InvalidInputError):
        saver.put_writes({"configurable": {"thread_id": "t", "checkpoint_id": "c"}},
                         [("chan\x00nel", 1)], "task")
    with pytest.raises(InvalidInputError):
        saver.put_writes({"configurable": {"thread_id": "t", "checkpoint_id": "c"}},
                         [("log", 1)], "task\x00")
    with pytest.raises(InvalidInputError):
        saver.put(_config("t"), checkpoint, {**metadata, "k\x00": 1}, {})  # type: ignore[misc]
    assert _counts(sync_client, saver.db_name) == before
    assert graph.get_state(_config("t")).values["log"] == ["x", *RACE_NODES]


def _value_entry(sync_client: MongoClient[Any], db: str, thread_id: str) -> dict[str, Any]:
    doc = sync_client[db].checkpoints.find_one(
        {"thread_id": thread_id, "values": {"$elemMatch": {"c": "log", "kind": "full"}}},
        sort=[("checkpoint_id", -1)],
    )
    assert doc is not None
    return doc


def _invalid_first_byte(data: bytes) -> bytes:
    return b"\xc1" + data[1:]  # 0xc1 is never valid in msgpack, nor in JSON


def _flip_first_bytes(data: bytes) -> bytes:
    return bytes(b ^ 0xFF for b in data[:4]) + data[4:]


@pytest.mark.parametrize("corrupt", [_invalid_first_byte, _flip_first_bytes])
def test_corrupt_payload_is_reported(saver: MongoSaver, sync_client: MongoClient[Any],
                                     corrupt: Any) -> None:
    graph = race_graph(saver, pause=0)
    graph.invoke({"log": ["hello corrupted world"]}, _config("corrupt"))
    doc = _value_entry(sync_client, saver.db_name, "corrupt")
    index = next(i for i, e in enumerate(doc["values"]) if e["c"] == "log" and "d" in e)
    data = bytes(doc["values"][index]["d"])
    coll = sync_client[saver.db_name].checkpoints
    coll.update_one({"_id": doc["_id"]}, {"$set": {f"values.{index}.d": corrupt(data)}})
    before = list(coll.find({}, sort=[("_id", 1)]))
    # A fresh process: nothing of the thread in its cache, so it must decode the payload.
    reader = MongoSaver(sync_client, saver.db_name)
    with pytest.raises(CorruptDocumentError, match="log"):
        race_graph(reader).get_state(_config("corrupt"))
    with pytest.raises(CorruptDocumentError):
        reader.get_tuple({"configurable": {"thread_id": "corrupt", "checkpoint_ns": "",
                                          "checkpoint_id": doc["checkpoint_id"]}})
    assert list(coll.find({}, sort=[("_id", 1)])) == before


@pytest.mark.parametrize("field", ["format", "schema_version"])
def test_newer_document_is_refused(saver: MongoSaver, sync_client: MongoClient[Any],
                                   field: str) -> None:
    graph = race_graph(saver, pause=0)
    graph.invoke({"log": ["x"]}, _config("future"))
    coll = sync_client[saver.db_name].checkpoints
    latest = coll.find_one({"thread_id": "future"}, sort=[("checkpoint_id", -1)])
    assert latest is not None
    coll.update_one({"_id": latest["_id"]}, {"$set": {field: 99}})
    before = list(coll.find({}, sort=[("_id", 1)]))
    with pytest.raises(SchemaVersionError, match="99"):
        race_graph(MongoSaver(sync_client, saver.db_name)).get_state(_config("future"))
    with pytest.raises(SchemaVersionError):
        graph.invoke({"log": ["more"]}, _config("future"))
    assert list(coll.find({}, sort=[("_id", 1)])) == before
    report = saver.check_integrity(["future"])
    assert [f.checkpoint_id for f in report.unknown_versions] == [latest["checkpoint_id"]]


# =========================================================================================
# Security
# =========================================================================================


class _Tripwire:
    """Unpickling this touches a file: proof that pickle ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.path),))


def test_no_pickle_by_default(saver: MongoSaver, sync_client: MongoClient[Any],
                              tmp_path: Path) -> None:
    assert getattr(saver.serde, "pickle_fallback", False) is False
    graph = race_graph(saver, pause=0)
    graph.invoke({"log": ["x"]}, _config("pickled"))
    doc = _value_entry(sync_client, saver.db_name, "pickled")
    index = next(i for i, e in enumerate(doc["values"]) if e["c"] == "log" and "d" in e)
    tripwire = tmp_path / "unpickled"
    sync_client[saver.db_name].checkpoints.update_one(
        {"_id": doc["_id"]},
        {"$set": {f"values.{index}.t": "pickle",
                  f"values.{index}.d": pickle.dumps(_Tripwire(str(tripwire)))}},
    )
    with pytest.raises(CorruptDocumentError):
        race_graph(MongoSaver(sync_client, saver.db_name)).get_state(_config("pickled"))
    assert not tripwire.exists(), "a stored pickle was executed"


def test_encrypted_serializer_round_trips(sync_client: MongoClient[Any], db_name: str) -> None:
    pytest.importorskip("Crypto", reason="pycryptodome is needed for EncryptedSerializer")
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"k" * 32)
    saver = MongoSaver(sync_client, db_name, serde=serde)
    saver.setup()
    secret = "PLAINTEXT-SECRET-" + uuid.uuid4().hex
    try:
        graph = race_graph(saver, pause=0)
        for i in range(3):
            graph.invoke({"log": [f"{secret}-{i}"]}, _config("vault"))
        expected = [x for i in range(3) for x in (f"{secret}-{i}", *RACE_NODES)]
        assert graph.get_state(_config("vault")).values["log"] == expected
        history = list(graph.get_state_history(_config("vault")))
        assert len(history) == len(list(saver.list(_config("vault"))))
        fresh = MongoSaver(sync_client, db_name, serde=serde, cache_size=0)
        assert race_graph(fresh).get_state(_config("vault")).values["log"] == expected
        from bson import encode

        db = sync_client[db_name]
        stored = b"".join(encode(d) for c in ("checkpoints", "checkpoint_writes")
                          for d in db[c].find({}))
        assert stored and b"PLAINTEXT-SECRET" not in stored
        assert secret.encode() not in stored
        for doc in db.checkpoints.find({}):
            for entry in doc["values"]:
                if "t" in entry:
                    assert entry["t"].endswith("+aes")
        unkeyed = MongoSaver(sync_client, db_name)
        with pytest.raises(CorruptDocumentError):
            race_graph(unkeyed).get_state(_config("vault"))
    finally:
        sync_client.drop_database(db_name)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _text_of(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


def test_credentials_never_leak(caplog: pytest.LogCaptureFixture) -> None:
    password = "hunter2-" + uuid.uuid4().hex
    uri = (f"mongodb://alice:{password}@127.0.0.1:{_closed_port()}/"
           "?serverSelectionTimeoutMS=300&connectTimeoutMS=300&retryWrites=false")
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    with MongoSaver.from_conn_string(uri, "creds") as saver:
        for action in (saver.setup, lambda: saver.get_tuple(_config("t")),
                       lambda: saver.lease("t", timeout=0.1).__enter__(),
                       lambda: saver.check_integrity()):
            with pytest.raises(Exception) as caught:
                action()
            seen.append(_text_of(caught.value))

    async def async_side() -> None:
        async with AsyncMongoSaver.from_conn_string(uri, "creds") as asaver:
            with pytest.raises(Exception) as caught:
                await asaver.setup()
            seen.append(_text_of(caught.value))

    asyncio.run(async_side())
    assert len(seen) == 5
    for text in [*seen, caplog.text]:
        assert password not in text
    assert "127.0.0.1" in seen[0]  # the error is still useful


@pytest.fixture(autouse=True)
def _no_leaked_lease_threads() -> Iterator[None]:
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not [t for t in threading.enumerate() if t.name.startswith("mongo-saver-lease")]:
            return
        time.sleep(0.05)
    pytest.fail("a lease renewal thread outlived its lease")

