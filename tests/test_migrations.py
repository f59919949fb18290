"""Lazy, reducer-aware schema migrations over the wire (issue 3's scenarios)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage
from pymongo import MongoClient

from mongo_saver import MigrationError, MongoSaver, SchemaMigrations, SchemaVersionError
from mongo_saver.migrations import StepBuilder
from tests.migration_graphs import Switch, demo_migrations, v1_graph, v2_graph

TURNS = ["hello", "what is mongo?", "thanks"]


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def v1_thread_with_failed_run(graph: Any, thread: str, turns: list[str] = TURNS) -> None:
    """Three turns, then a run whose `classify` fails after `retrieve` succeeded."""
    for text in turns:
        graph.invoke({"messages": [HumanMessage(text)]}, cfg(thread))
    Switch.fail = True
    try:
        with pytest.raises(RuntimeError, match="classifier is down"):
            graph.invoke({"messages": [HumanMessage("one more?")]}, cfg(thread))
    finally:
        Switch.fail = False


def raw_docs(client: MongoClient[Any], db: str, thread: str) -> list[Any]:
    return [
        list(client[db][name].find({"thread_id": thread}).sort("_id", 1))
        for name in ("checkpoints", "checkpoint_writes")
    ]


def versions_in_db(client: MongoClient[Any], db: str, thread: str) -> set[Any]:
    return {
        (name, d.get("schema_version"))
        for name in ("checkpoints", "checkpoint_writes")
        for d in client[db][name].find({"thread_id": thread}, {"schema_version": 1})
    }


@pytest.mark.parametrize("delta", [False, True], ids=["reducers", "delta-channels"])
def test_v1_thread_is_read_resumed_and_upgraded_by_v2(
    make_sync_saver: Any, sync_client: MongoClient[Any], db_name: str, delta: bool
) -> None:
    old, other = uuid.uuid4().hex, uuid.uuid4().hex
    v1 = v1_graph(make_sync_saver(), delta=delta)
    v1_thread_with_failed_run(v1, old)
    v1_thread_with_failed_run(v1, other)
    assert versions_in_db(sync_client, db_name, old) == {
        ("checkpoints", 1), ("checkpoint_writes", 1)}

    saver = make_sync_saver(migrations=demo_migrations())
    v2 = v2_graph(saver, delta=delta)
    state = v2.get_state(cfg(old))
    # get_state shows the succeeded task's pending write applied, migrated like the rest.
    assert state.values["context"] == [{"text": f"doc about {t}"} for t in [*TURNS, "one more?"]]
    assert state.values["route"] == "CHAT"
    assert state.values["summary"] == ""
    assert "retrieved_context" not in state.values
    pending = saver.get_tuple(cfg(old)).pending_writes
    assert ("context", [{"text": "doc about one more?"}]) in [(c, v) for _, c, v in pending]

    result = v2.invoke(None, cfg(old))  # resumes: only classify and respond run
    assert result["context"] == [{"text": f"doc about {t}"} for t in [*TURNS, "one more?"]]
    assert result["route"] == "FAQ"
    assert result["messages"][-1].content == "4 docs"
    assert [m.content for m in result["messages"]][:2] == ["hello", "1 docs"]

    history = list(v2.get_state_history(cfg(old)))
    assert len(history) > 10
    for snapshot in history:
        assert "retrieved_context" not in snapshot.values
        assert all(isinstance(item, dict) for item in snapshot.values.get("context", []))
        assert snapshot.values.get("route", "") == snapshot.values.get("route", "").upper()
    assert versions_in_db(sync_client, db_name, old) == {
        ("checkpoints", 2), ("checkpoint_writes", 2)}
    assert versions_in_db(sync_client, db_name, other) == {
        ("checkpoints", 1), ("checkpoint_writes", 1)}
    # The migrated thread reads the same through a fresh saver (no cache).
    again = v2_graph(MongoSaver(sync_client, db_name=db_name, migrations=demo_migrations()),
                     delta=delta)
    assert again.get_state(cfg(old)).values == v2.get_state(cfg(old)).values


def test_thread_written_by_langgraph_checkpoint_mongodb_is_read_resumed_and_upgraded(
    make_sync_saver: Any, sync_client: MongoClient[Any], db_name: str
) -> None:
    from langgraph.checkpoint.mongodb import MongoDBSaver

    thread = uuid.uuid4().hex
    incumbent = MongoDBSaver(sync_client, db_name=db_name)
    v1_thread_with_failed_run(v1_graph(incumbent), thread)
    stored = sync_client[db_name]["checkpoints"].find_one({"thread_id": thread})
    assert stored is not None and "format" not in stored and "type" in stored
    expected = v1_graph(incumbent).get_state(cfg(thread)).values

    # Pointed at the same collections, the v1 app keeps working ...
    plain = v1_graph(make_sync_saver())
    assert plain.get_state(cfg(thread)).values == expected
    # ... and the v2 app migrates and resumes the same thread.
    v2 = v2_graph(make_sync_saver(migrations=demo_migrations()))
    result = v2.invoke(None, cfg(thread))
    assert result["context"] == [{"text": f"doc about {t}"} for t in [*TURNS, "one more?"]]
    assert result["messages"][-1].content == "4 docs"
    list(v2.get_state_history(cfg(thread)))
    formats = {d.get("format") for d in sync_client[db_name]["checkpoints"].find(
        {"thread_id": thread})}
    assert formats == {1}
    write_formats = {d.get("format") for d in sync_client[db_name]["checkpoint_writes"].find(
        {"thread_id": thread})}
    assert write_formats == {1}


def test_list_filter_matches_legacy_metadata(make_sync_saver: Any, sync_client: Any,
                                             db_name: str) -> None:
    from langgraph.checkpoint.mongodb import MongoDBSaver

    thread = uuid.uuid4().hex
    graph = v1_graph(MongoDBSaver(sync_client, db_name=db_name))
    graph.invoke({"messages": [HumanMessage("hi")]}, cfg(thread))
    saver = make_sync_saver(write_back=False)
    inputs = list(saver.list(cfg(thread), filter={"source": "input"}))
    assert [t.metadata["step"] for t in inputs] == [-1]


def failing_migrations() -> SchemaMigrations:
    migrations = SchemaMigrations()

    @migrations.step(1)
    def explode(m: StepBuilder) -> None:
        m.map_value("route", lambda route: 1 / 0)

    return migrations


def test_a_failing_step_names_thread_checkpoint_step_and_changes_nothing(
    make_sync_saver: Any, sync_client: MongoClient[Any], db_name: str
) -> None:
    thread = uuid.uuid4().hex
    v1_thread_with_failed_run(v1_graph(make_sync_saver()), thread)
    before = raw_docs(sync_client, db_name, thread)
    saver = make_sync_saver(migrations=failing_migrations())
    with pytest.raises(MigrationError) as error:
        saver.get_tuple(cfg(thread))
    message = str(error.value)
    assert thread in message and "step 1 (explode)" in message and "ZeroDivisionError" in message
    latest = before[0][-1]["checkpoint_id"]
    assert latest in message
    assert raw_docs(sync_client, db_name, thread) == before


def test_newer_document_than_the_code_is_refused(
    make_sync_saver: Any, sync_client: MongoClient[Any], db_name: str
) -> None:
    thread = uuid.uuid4().hex
    v2 = v2_graph(make_sync_saver(migrations=demo_migrations()))
    v2.invoke({"messages": [HumanMessage("hi")], "context": [], "summary": ""}, cfg(thread))
    old_code = make_sync_saver()  # no migrations: schema version 1
    with pytest.raises(SchemaVersionError, match=r"schema_version 2.*rolled back"):
        old_code.get_tuple(cfg(thread))


def test_write_back_off_migrates_in_memory_only(
    make_sync_saver: Any, sync_client: MongoClient[Any], db_name: str
) -> None:
    thread = uuid.uuid4().hex
    v1_thread_with_failed_run(v1_graph(make_sync_saver()), thread)
    before = raw_docs(sync_client, db_name, thread)
    reader = make_sync_saver(migrations=demo_migrations(), write_back=False)
    values = v2_graph(reader).get_state(cfg(thread)).values
    assert values["context"][0] == {"text": "doc about hello"}
    list(reader.list(cfg(thread)))
    assert raw_docs(sync_client, db_name, thread) == before


def test_validate_reports_reducer_mismatch(make_sync_saver: Any) -> None:
    wrong = SchemaMigrations()

    @wrong.step(1)
    def confused(m: StepBuilder) -> None:
        m.rename_channel("retrieved_context", "context")
        m.map_value("context", list)
        m.map_items("route", str.upper)

    graph = v2_graph(make_sync_saver())
    problems = wrong.validate(graph)
    assert len(problems) == 2
    assert "map_value on 'context'" in problems[0] and "accumulates" in problems[0]
    assert "map_items on 'route'" in problems[1] and "replaces" in problems[1]
    assert demo_migrations().validate(graph) == []


# --- properties ------------------------------------------------------------------------------

texts = st.lists(st.sampled_from(["hi", "why?", "ok", "how?"]), min_size=1, max_size=4)


def contents(values: dict[str, Any]) -> dict[str, Any]:
    """State with message ids dropped (they are random per run)."""
    return {**values, "messages": [(type(m).__name__, m.content) for m in values["messages"]]}


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(turns=texts, delta=st.booleans())
def test_migrated_thread_equals_new_graph_run_from_migrated_start(
    make_sync_saver: Any, turns: list[str], delta: bool
) -> None:
    old, fresh = uuid.uuid4().hex, uuid.uuid4().hex
    v1_graph(make_sync_saver(), delta=delta)
    for text in turns:
        v1_graph(make_sync_saver(), delta=delta).invoke(
            {"messages": [HumanMessage(text)]}, cfg(old))
    v2 = v2_graph(make_sync_saver(migrations=demo_migrations()), delta=delta)
    for text in turns:
        v2.invoke({"messages": [HumanMessage(text)], "summary": ""}, cfg(fresh))
    migrated = contents(v2.get_state(cfg(old)).values)
    assert migrated == contents(v2.get_state(cfg(fresh)).values)
    # Migrating twice equals migrating once: a second reader sees the same and changes nothing.
    second = v2_graph(make_sync_saver(migrations=demo_migrations()), delta=delta)
    assert contents(second.get_state(cfg(old)).values) == migrated


def test_concurrent_readers_end_with_one_consistent_upgraded_thread(
    make_sync_saver: Any, sync_client: MongoClient[Any], db_name: str
) -> None:
    thread = uuid.uuid4().hex
    v1_thread_with_failed_run(v1_graph(make_sync_saver()), thread)
    readers = [v2_graph(make_sync_saver(migrations=demo_migrations())) for _ in range(6)]
    results: list[Any] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(readers))

    def read(graph: Any) -> None:
        try:
            barrier.wait()
            results.append([contents(s.values) for s in graph.get_state_history(cfg(thread))])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    workers = [threading.Thread(target=read, args=(g,)) for g in readers]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    assert all(r == results[0] for r in results)
    assert versions_in_db(sync_client, db_name, thread) == {
        ("checkpoints", 2), ("checkpoint_writes", 2)}
    final = v2_graph(MongoSaver(sync_client, db_name=db_name, migrations=demo_migrations()))
    assert [contents(s.values) for s in final.get_state_history(cfg(thread))] == results[0]


# --- eager migration ----------------------------------------------------------------------


class Crash(Exception):
    pass


def test_eager_migration_dry_run_status_and_resume_after_crash(
    make_sync_saver: Any, sync_client: MongoClient[Any], db_name: str
) -> None:
    from langgraph.checkpoint.mongodb import MongoDBSaver

    threads = sorted(uuid.uuid4().hex for _ in range(3))
    v1 = v1_graph(make_sync_saver())
    for thread in threads[:2]:
        v1_thread_with_failed_run(v1, thread)
    v1_thread_with_failed_run(v1_graph(MongoDBSaver(sync_client, db_name=db_name)), threads[2])
    saver = make_sync_saver(migrations=demo_migrations())
    before = [raw_docs(sync_client, db_name, t) for t in threads]
    total = sum(len(docs[0]) for docs in before)

    dry = saver.migrate(dry_run=True)
    assert (dry.dry_run, dry.threads, dry.checkpoints, dry.failures) == (True, 3, total, [])
    assert [raw_docs(sync_client, db_name, t) for t in threads] == before

    status = {(r["collection"], r["format"], r["schema_version"]): r["documents"]
              for r in saver.migration_status()}
    assert status[("checkpoints", 0, 1)] == len(before[2][0])
    assert status[("checkpoints", 1, 1)] == len(before[0][0]) + len(before[1][0])

    def crash_on_second(thread: str) -> None:
        if thread == threads[1]:
            raise Crash

    with pytest.raises(Crash):
        saver.migrate(on_thread=crash_on_second)
    assert versions_in_db(sync_client, db_name, threads[0]) == {
        ("checkpoints", 2), ("checkpoint_writes", 2)}
    first_after_crash = raw_docs(sync_client, db_name, threads[0])

    resumed = saver.migrate(batch_size=1)
    assert (resumed.threads, resumed.failures) == (2, [])
    assert raw_docs(sync_client, db_name, threads[0]) == first_after_crash  # not redone
    for thread in threads:
        assert versions_in_db(sync_client, db_name, thread) == {
            ("checkpoints", 2), ("checkpoint_writes", 2)}
    status = {(r["collection"], r["format"], r["schema_version"]) for r in saver.migration_status()}
    assert status == {("checkpoints", 1, 2), ("checkpoint_writes", 1, 2)}
    v2 = v2_graph(saver)
    assert v2.invoke(None, cfg(threads[2]))["messages"][-1].content == "4 docs"


def raw_migrations() -> SchemaMigrations:
    """Step 1 declared as in the demo; step 2 raw: tag every context item and route."""
    migrations = demo_migrations()

    def tag(checkpoint: dict[str, Any], writes: list[Any]) -> tuple[dict[str, Any], list[Any]]:
        values = dict(checkpoint["channel_values"])
        if "route" in values:
            values["route"] = f"{values['route']}!"
        return {**checkpoint, "channel_values": values}, [
            (task, channel, [{**i, "raw": True} for i in value] if channel == "context" else value)
            for task, channel, value in writes
        ]

    @migrations.step(2)
    def tag_everything(m: StepBuilder) -> None:
        m.raw(tag)

    return migrations


def test_raw_step_migrates_whole_checkpoints_and_their_writes(
    make_sync_saver: Any, sync_client: MongoClient[Any], db_name: str
) -> None:
    thread = uuid.uuid4().hex
    v1_thread_with_failed_run(v1_graph(make_sync_saver()), thread)
    saver = make_sync_saver(migrations=raw_migrations())
    history = list(saver.list(cfg(thread)))
    assert len(history) > 10
    assert all(t.checkpoint["channel_values"].get("route", "!").endswith("!") for t in history)
    pending = saver.get_tuple(cfg(thread)).pending_writes
    assert ("context", [{"text": "doc about one more?", "raw": True}]) in [
        (c, v) for _, c, v in pending]
    assert versions_in_db(sync_client, db_name, thread) == {
        ("checkpoints", 3), ("checkpoint_writes", 3)}
    again = make_sync_saver(migrations=raw_migrations()).get_tuple(cfg(thread))
    assert again.checkpoint["channel_values"]["route"] == "CHAT!"
    assert ("context", [{"text": "doc about one more?", "raw": True}]) in [
        (c, v) for _, c, v in again.pending_writes]


def test_setup_refuses_the_incumbents_ttl_index(
    sync_client: MongoClient[Any], db_name: str
) -> None:
    from langgraph.checkpoint.mongodb import MongoDBSaver

    from mongo_saver import MongoSaverError

    MongoDBSaver(sync_client, db_name=db_name, ttl=3600)  # creates its TTL index
    with pytest.raises(MongoSaverError, match=r"TTL index 'created_at_1'.*dropIndex"):
        MongoSaver(sync_client, db_name=db_name).setup()
    sync_client[db_name]["checkpoints"].drop_index("created_at_1")
    sync_client[db_name]["checkpoint_writes"].drop_index("created_at_1")
    MongoSaver(sync_client, db_name=db_name).setup()
