"""The `mongo-saver` CLI over the wire: every command, its `--json` form, the error paths."""

from __future__ import annotations

import datetime as dt
import json
import operator
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from pymongo import MongoClient
from servers import free_port
from typer.testing import CliRunner

from mongo_saver import MongoSaver
from mongo_saver.cli import app, redact_uri, scrub
from mongo_saver.migrations import load_migrations

THREAD = "cli-thread"
OTHER = "cli-other"


class State(TypedDict):
    topic: str
    notes: Annotated[list[str], operator.add]


def _graph(saver: MongoSaver, *, fail_b: bool = False) -> Any:
    def node_a(state: State) -> dict[str, Any]:
        return {"topic": state["topic"].upper(), "notes": ["a"]}

    def node_b(state: State) -> dict[str, Any]:
        if fail_b:
            raise RuntimeError("b is down")
        return {"notes": ["b"]}

    builder = StateGraph(State)
    builder.add_node("node_a", node_a)
    builder.add_node("node_b", node_b)
    builder.add_edge(START, "node_a")
    builder.add_edge("node_a", "node_b")
    builder.add_edge("node_b", END)
    return builder.compile(checkpointer=saver)


@pytest.fixture
def populated(mongodb_uri: str, db_name: str) -> Iterator[dict[str, Any]]:
    """Two runs on THREAD (the second one failing in node_b), one run on OTHER."""
    client: MongoClient[dict[str, Any]] = MongoClient(mongodb_uri)
    try:
        saver = MongoSaver(client, db_name)
        saver.setup()
        config = {"configurable": {"thread_id": THREAD}}
        _graph(saver).invoke({"topic": "memory", "notes": []}, config)
        with pytest.raises(RuntimeError):
            _graph(saver, fail_b=True).invoke({"topic": "again", "notes": ["x"]}, config)
        _graph(saver).invoke({"topic": "other", "notes": []},
                             {"configurable": {"thread_id": OTHER}})
        ids = [t.checkpoint["id"] for t in saver.list(config)]  # newest first
        yield {"uri": mongodb_uri, "db": db_name, "ids": ids, "client": client}
    finally:
        client.drop_database(db_name)
        client.close()


def run(uri: str | None, db: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """Invoke the CLI in-process; a wide terminal so tables show every column."""
    base = ["--uri", uri] if uri is not None else []
    wide = {"COLUMNS": "200", **(env or {})}
    return CliRunner().invoke(app, [*base, "--db", db, *args], env=wide)


def ok_json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def assert_one_line_error(result: Any, *expected: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    for text in expected:
        assert text in lines[0]


# --- commands ----------------------------------------------------------------------------


def test_setup_creates_indexes(mongodb_uri: str, db_name: str) -> None:
    try:
        result = run(mongodb_uri, db_name, "setup")
        assert result.exit_code == 0, result.output
        assert "Indexes are in place." in result.stdout
        data = ok_json(run(mongodb_uri, db_name, "setup", "--json"))  # idempotent
        assert data["database"] == db_name
        unique = {
            collection: [[k for k, _ in ix["key"]] for ix in indexes if ix["unique"]]
            for collection, indexes in data["indexes"].items()
        }
        assert ["thread_id", "checkpoint_ns", "checkpoint_id"] in unique["checkpoints"]
        assert ["thread_id", "checkpoint_ns", "checkpoint_id", "task_path", "task_id",
                "idx"] in unique["checkpoint_writes"]
    finally:
        with MongoClient(mongodb_uri) as client:
            client.drop_database(db_name)


def test_threads(populated: dict[str, Any]) -> None:
    uri, db = populated["uri"], populated["db"]
    result = run(uri, db, "threads")
    assert result.exit_code == 0, result.output
    assert THREAD in result.stdout and OTHER in result.stdout

    rows = ok_json(run(uri, db, "threads", "--json"))
    by_id = {r["thread_id"]: r for r in rows}
    assert set(by_id) == {THREAD, OTHER}
    assert rows[0]["thread_id"] == OTHER  # most recently active first
    mine = by_id[THREAD]
    assert mine["checkpoints"] == len(populated["ids"])
    assert mine["schema_versions"] == [1] and mine["formats"] == [1]
    assert mine["writes"] > 0 and mine["size_bytes"] > 0
    assert mine["last_activity"] is not None

    limited = ok_json(run(uri, db, "threads", "--limit", "1", "--json"))
    assert [r["thread_id"] for r in limited] == [OTHER]
    prefixed = ok_json(run(uri, db, "threads", "--prefix", "cli-t", "--json"))
    assert [r["thread_id"] for r in prefixed] == [THREAD]
    largest = ok_json(run(uri, db, "threads", "--largest", "--json"))
    assert [r["thread_id"] for r in largest] == [THREAD, OTHER]  # two runs outweigh one
    assert largest[0]["size_bytes"] > largest[1]["size_bytes"]
    assert "largest first" in run(uri, db, "threads", "--largest").stdout


def test_threads_on_empty_database(mongodb_uri: str, db_name: str) -> None:
    result = run(mongodb_uri, db_name, "threads")
    assert result.exit_code == 0, result.output
    assert "No threads" in result.stdout
    assert ok_json(run(mongodb_uri, db_name, "threads", "--json")) == []


def test_history(populated: dict[str, Any]) -> None:
    uri, db, ids = populated["uri"], populated["db"], populated["ids"]
    result = run(uri, db, "history", THREAD)
    assert result.exit_code == 0, result.output
    assert ids[0] in result.stdout

    rows = ok_json(run(uri, db, "history", THREAD, "--json"))
    assert [r["checkpoint_id"] for r in rows] == ids
    # first run: steps -1..2; the second run (input 3, start 4, node_a 5) fails in node_b
    assert [r["step"] for r in rows] == [5, 4, 3, 2, 1, 0, -1]
    latest = rows[0]
    assert latest["next"] == ["node_b"]  # derived from the stored triggers
    assert latest["errors"] == 1  # node_b's error is a pending write
    assert latest["changed"] == ["notes", "topic"]
    assert latest["size_bytes"] > 0 and latest["schema_version"] == 1
    assert rows[3]["next"] == [] and rows[3]["source"] == "loop"
    assert rows[2]["next"] == ["__start__"] and rows[2]["source"] == "input"
    assert rows[-1]["next"] == ["__start__"] and rows[-1]["source"] == "input"
    assert rows[1]["parent_checkpoint_id"] == rows[2]["checkpoint_id"]

    limited = ok_json(run(uri, db, "history", THREAD, "--limit", "2", "--json"))
    assert [r["checkpoint_id"] for r in limited] == ids[:2]


def test_show(populated: dict[str, Any]) -> None:
    uri, db, ids = populated["uri"], populated["db"], populated["ids"]
    result = run(uri, db, "show", THREAD)
    assert result.exit_code == 0, result.output
    assert "AGAIN" in result.stdout and "Pending writes" in result.stdout

    view = ok_json(run(uri, db, "show", THREAD, "--json"))
    assert view["checkpoint_id"] == ids[0]
    assert view["values"] == {"topic": "AGAIN", "notes": ["a", "b", "x", "a"]}
    assert view["next"] == ["node_b"]
    errors = [w for w in view["pending_writes"] if w["channel"] == "__error__"]
    assert len(errors) == 1 and errors[0]["node"] == "node_b"
    assert view["metadata"]["step"] == 5

    # an older checkpoint, by a unique prefix of its id
    older = ids[3]
    view = ok_json(run(uri, db, "show", THREAD, older[:-4], "--json"))
    assert view["checkpoint_id"] == older
    assert view["values"] == {"topic": "MEMORY", "notes": ["a", "b"]}
    assert view["pending_writes"] == []
    internal = ok_json(run(uri, db, "show", THREAD, ids[-1], "--all-channels", "--json"))
    assert "__start__" in internal["values"]


def test_diff(populated: dict[str, Any]) -> None:
    uri, db, ids = populated["uri"], populated["db"], populated["ids"]
    result = run(uri, db, "diff", THREAD, ids[3], ids[0])
    assert result.exit_code == 0, result.output
    assert "appended" in result.stdout and "+2 item(s)" in result.stdout

    data = ok_json(run(uri, db, "diff", THREAD, ids[3], ids[0], "--json"))
    changes = {r["channel"]: r for r in data["channels"]}
    assert changes["notes"]["change"] == "appended"
    assert changes["notes"]["count"] == 2 and changes["notes"]["items"] == ["x", "a"]
    assert changes["topic"] == {"channel": "topic", "change": "changed",
                                "before": "MEMORY", "after": "AGAIN"}
    assert data["a"]["step"] == 2 and data["b"]["step"] == 5

    # B defaults to the latest checkpoint; the input checkpoint has no state channels yet
    data = ok_json(run(uri, db, "diff", THREAD, ids[-1], "--json"))
    added = {r["channel"]: r for r in data["channels"]}
    assert added["notes"]["change"] == "added" and added["topic"]["change"] == "added"

    reverse = ok_json(run(uri, db, "diff", THREAD, ids[0], ids[3], "--json"))
    notes = next(r for r in reverse["channels"] if r["channel"] == "notes")
    assert notes["change"] == "truncated" and notes["count"] == 2


def test_stats(populated: dict[str, Any]) -> None:
    uri, db = populated["uri"], populated["db"]
    result = run(uri, db, "stats")
    assert result.exit_code == 0, result.output
    assert "checkpoints" in result.stdout

    data = ok_json(run(uri, db, "stats", "--json"))
    client = populated["client"]
    assert data["threads"] == 2
    assert data["checkpoints"] == client[db]["checkpoints"].count_documents({})
    assert data["writes"] == client[db]["checkpoint_writes"].count_documents({})
    [version] = data["checkpoints_by_version"]
    assert version["format"] == 1 and version["schema_version"] == 1
    assert version["checkpoints"] == data["checkpoints"] and version["threads"] == 2
    assert data["size_bytes"] > 0 and data["largest_checkpoint_bytes"] > 0
    kinds = {k["kind"] for k in data["value_entries"]}
    assert "full" in kinds and "append" in kinds


def test_custom_collection_names(mongodb_uri: str, db_name: str) -> None:
    with MongoClient(mongodb_uri) as client:
        try:
            saver = MongoSaver(client, db_name, checkpoint_collection="cp",
                               writes_collection="wr")
            saver.setup()
            _graph(saver).invoke({"topic": "t", "notes": []},
                                 {"configurable": {"thread_id": "custom"}})
            opts = ["--checkpoint-collection", "cp", "--writes-collection", "wr"]
            rows = ok_json(run(mongodb_uri, db_name, *opts, "threads", "--json"))
            assert [r["thread_id"] for r in rows] == ["custom"]
            view = ok_json(run(mongodb_uri, db_name, *opts, "show", "custom", "--json"))
            assert view["values"]["notes"] == ["a", "b"]
            assert ok_json(run(mongodb_uri, db_name, "threads", "--json")) == []
        finally:
            client.drop_database(db_name)


def test_uri_from_environment(populated: dict[str, Any]) -> None:
    result = run(None, populated["db"], "threads", "--json",
                 env={"MONGODB_URI": populated["uri"]})
    assert {r["thread_id"] for r in ok_json(result)} == {THREAD, OTHER}


def test_check(populated: dict[str, Any]) -> None:
    uri, db = populated["uri"], populated["db"]
    result = run(uri, db, "check")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("clean: ")
    data = ok_json(run(uri, db, "check", THREAD, "--json"))
    assert data["clean"] is True and data["threads_checked"] == 1

    # a pending write whose checkpoint does not exist
    writes = populated["client"][db]["checkpoint_writes"]
    orphan = writes.find_one({"thread_id": THREAD}, {"_id": 0})
    assert orphan is not None
    orphan["checkpoint_id"] = "0-missing-checkpoint"
    writes.insert_one(orphan)
    result = run(uri, db, "check", "--json")
    assert result.exit_code == 2, result.output
    data = json.loads(result.stdout)
    assert data["clean"] is False
    assert [f["kind"] for f in data["findings"] if f["kind"] != "fork"] == ["orphan_write"]
    result = run(uri, db, "check", THREAD)
    assert result.exit_code == 2 and "NOT clean" in result.stdout


def test_expire(populated: dict[str, Any]) -> None:
    uri, db, client = populated["uri"], populated["db"], populated["client"]
    assert ok_json(run(uri, db, "expire", "--idle", "1d", "--dry-run", "--json"))[
        "expired"] == []
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=3)
    client[db]["checkpoints"].update_many({"thread_id": OTHER}, {"$set": {"created_at": old}})

    preview = ok_json(run(uri, db, "expire", "--idle", "2d", "--dry-run", "--json"))
    assert [e["thread_id"] for e in preview["expired"]] == [OTHER]
    assert client[db]["checkpoints"].count_documents({"thread_id": OTHER}) > 0

    assert_one_line_error(run(uri, db, "expire", "--idle", "2d"), "--yes")
    assert_one_line_error(run(uri, db, "expire", "--idle", "soon", "--yes"), "duration")

    result = run(uri, db, "expire", "--idle", "2d", "--yes")
    assert result.exit_code == 0, result.output
    assert "1 thread(s) expired" in result.stdout
    assert client[db]["checkpoints"].count_documents({"thread_id": OTHER}) == 0
    assert client[db]["checkpoint_writes"].count_documents({"thread_id": OTHER}) == 0
    rows = ok_json(run(uri, db, "threads", "--json"))
    assert [r["thread_id"] for r in rows] == [THREAD]


def test_migrations_option(mongodb_uri: str, db_name: str) -> None:
    """Checkpoints at a newer schema version need --migrations; reading writes nothing."""
    migrations_dir = Path(__file__).resolve().parent.parent / "migrations"
    with MongoClient(mongodb_uri) as client:
        try:
            saver = MongoSaver(client, db_name, migrations=load_migrations(migrations_dir))
            saver.setup()
            _graph(saver).invoke({"topic": "t", "notes": []},
                                 {"configurable": {"thread_id": "v2"}})
            rows = ok_json(run(mongodb_uri, db_name, "threads", "--json"))
            assert rows[0]["schema_versions"] == [2]

            result = run(mongodb_uri, db_name, "show", "v2")
            assert_one_line_error(result, "schema_version 2", "--migrations")

            before = list(client[db_name]["checkpoints"].find({}, {"_id": 0}))
            opts = ["--migrations", str(migrations_dir)]
            view = ok_json(run(mongodb_uri, db_name, *opts, "show", "v2", "--json"))
            assert view["values"]["notes"] == ["a", "b"]
            history = ok_json(run(mongodb_uri, db_name, *opts, "history", "v2", "--json"))
            assert {r["schema_version"] for r in history} == {2}
            assert list(client[db_name]["checkpoints"].find({}, {"_id": 0})) == before

            result = run(mongodb_uri, db_name, "--migrations", "/no/such/dir", "show", "v2")
            assert_one_line_error(result, "not a directory")
        finally:
            client.drop_database(db_name)


# --- error paths -----------------------------------------------------------------------


@pytest.mark.parametrize("command", [["history"], ["show"], ["diff", "a", "b"]])
def test_unknown_thread(populated: dict[str, Any], command: list[str]) -> None:
    args = [command[0], "no-such-thread", *command[1:]]
    result = run(populated["uri"], populated["db"], *args)
    assert_one_line_error(result, "'no-such-thread'", "not found")


def test_unknown_checkpoint(populated: dict[str, Any]) -> None:
    result = run(populated["uri"], populated["db"], "show", THREAD, "ffff-not-an-id")
    assert_one_line_error(result, "'ffff-not-an-id'", "not found")
    result = run(populated["uri"], populated["db"], "diff", THREAD, "1f", "--json")
    assert_one_line_error(result, "ambiguous")


@pytest.mark.parametrize("command", [["threads"], ["stats"], ["history", "t"], ["setup"],
                                     ["show", "t"], ["diff", "t", "a", "b"], ["check"],
                                     ["expire", "--idle", "1d", "--dry-run"]])
def test_no_server(db_name: str, command: list[str]) -> None:
    port = free_port()  # nothing listens there
    uri = f"mongodb://alice:pa55word@127.0.0.1:{port}/?directConnection=true"
    started = time.monotonic()
    result = run(uri, db_name, "--timeout", "1", *command, "--json")
    assert time.monotonic() - started < 15
    assert_one_line_error(result, "cannot reach", f"127.0.0.1:{port}")
    assert "pa55word" not in result.output and "alice" not in result.output


@pytest.mark.parametrize(
    "uri",
    [
        "http://127.0.0.1:27017",
        "mongodb://",
        "mongodb://alice:p@ss:word@127.0.0.1:1/",
        "mongodb+srv://alice:pa55word@host-without-dots/",
    ],
)
def test_bad_uri(db_name: str, uri: str) -> None:
    result = run(uri, db_name, "threads")
    assert_one_line_error(result, "invalid MongoDB URI")
    assert "pa55word" not in result.output and "p@ss:word" not in result.output


def test_missing_uri(db_name: str) -> None:
    result = CliRunner().invoke(app, ["--db", db_name, "threads"], env={"MONGODB_URI": ""})
    assert_one_line_error(result, "MONGODB_URI")


def test_redaction_helpers() -> None:
    uri = "mongodb://alice:pa55word@db.example.com:27017/?tls=true"
    assert redact_uri(uri) == "mongodb://***@db.example.com:27017/?tls=true"
    assert redact_uri("mongodb://db.example.com/") == "mongodb://db.example.com/"
    message = f"could not connect to {uri} as alice with pa55word"
    cleaned = scrub(message, uri)
    assert "pa55word" not in cleaned and "alice" not in cleaned
    assert "db.example.com" in cleaned


def test_migrate_and_migration_status(mongodb_uri: str, db_name: str) -> None:
    from langchain_core.messages import HumanMessage

    from tests.migration_graphs import v1_graph

    client: MongoClient[Any] = MongoClient(mongodb_uri)
    try:
        graph = v1_graph(MongoSaver(client, db_name))
        for thread in ("a", "b"):
            graph.invoke({"messages": [HumanMessage("hi")]},
                         {"configurable": {"thread_id": thread}})
        n = client[db_name]["checkpoints"].count_documents({})
    finally:
        client.close()
    repo_migrations = str(Path(__file__).resolve().parent.parent / "migrations")

    status = ok_json(run(mongodb_uri, db_name, "--migrations", repo_migrations,
                         "migration-status", "--json"))
    assert status["current_schema_version"] == 2
    assert {(r["collection"], r["schema_version"], r["state"]) for r in status["rows"]} == {
        ("checkpoints", 1, "outdated"), ("checkpoint_writes", 1, "outdated")}

    dry = ok_json(run(mongodb_uri, db_name, "--migrations", repo_migrations,
                      "migrate", "--dry-run", "--json"))
    assert dry == {"dry_run": True, "threads": 2, "checkpoints": n, "failures": []}
    done = ok_json(run(mongodb_uri, db_name, "--migrations", repo_migrations, "migrate", "--json"))
    assert done == {"dry_run": False, "threads": 2, "checkpoints": n, "failures": []}
    text = run(mongodb_uri, db_name, "--migrations", repo_migrations, "migration-status")
    assert text.exit_code == 0 and "current" in text.output and "outdated" not in text.output
    again = ok_json(run(mongodb_uri, db_name, "--migrations", repo_migrations, "migrate", "--json"))
    assert again["threads"] == 0  # resumable: nothing left to do

    old_code = run(mongodb_uri, db_name, "migration-status", "--json")
    rows = ok_json(old_code)["rows"]
    assert {r["state"] for r in rows} == {"newer than this code"}
