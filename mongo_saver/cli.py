"""`mongo-saver`: look at what LangGraph threads hold in MongoDB, without writing code.

Every command reads through the public saver API (with write-back turned off, so looking
never rewrites a document) or through the read-only summaries of `mongo_saver.inspect`.
Listings print rich tables, or machine-readable JSON on stdout with `--json`. Failures are
one line on stderr and exit code 1; the connection string's credentials are never printed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pymongo import MongoClient
from pymongo.errors import (
    ConfigurationError,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)
from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.pretty import Pretty
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from mongo_saver import inspect as insp
from mongo_saver.documents import FORMAT_VERSION
from mongo_saver.errors import MongoSaverError, SchemaVersionError
from mongo_saver.migrations import SchemaMigrations, load_migrations
from mongo_saver.sync import MongoSaver

app = typer.Typer(
    name="mongo-saver",
    help="Inspect LangGraph checkpoints stored in MongoDB by mongo-saver.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

DEFAULT_TIMEOUT_S = 3.0
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON only.")]


class CliError(Exception):
    """A failure reported to the user as one line on stderr."""


# --- connection string hygiene -------------------------------------------------------

_USERINFO = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^@/?#]*)@")


def redact_uri(uri: str) -> str:
    """The URI with any `user:password@` replaced by `***@`."""
    return _USERINFO.sub(lambda m: m.group("scheme") + "***@", uri)


def _uri_hosts(uri: str) -> str:
    rest = redact_uri(uri).split("://", 1)[-1]
    rest = rest.split("@", 1)[-1]
    return re.split(r"[/?]", rest, maxsplit=1)[0] or "(no host)"


def scrub(text: str, uri: str | None) -> str:
    """Remove the URI's credentials (and the URI itself) from an error message."""
    text = " ".join(str(text).split())
    if uri:
        match = _USERINFO.match(uri)
        if match:
            userinfo = match.group("userinfo")
            secrets = [userinfo, *userinfo.split(":", 1)]
            text = text.replace(uri, redact_uri(uri))
            for secret in sorted({s for s in secrets if len(s) >= 3}, key=len, reverse=True):
                text = text.replace(secret, "***")
    if len(text) > 300:
        text = text[:297] + "..."
    return text


# --- shared state ------------------------------------------------------------------------


@dataclass
class Settings:
    uri: str | None
    db: str
    checkpoint_collection: str
    writes_collection: str
    migrations: Path | None
    timeout: float
    _client: MongoClient[dict[str, Any]] | None = field(default=None, repr=False)

    def client(self) -> MongoClient[dict[str, Any]]:
        if self._client is not None:
            return self._client
        if not self.uri:
            raise CliError("no MongoDB connection string: pass --uri or set MONGODB_URI")
        ms = int(self.timeout * 1000)
        try:
            with warnings.catch_warnings():
                # pymongo warns about unknown options; the connection attempt decides.
                warnings.simplefilter("ignore")
                client: MongoClient[dict[str, Any]] = MongoClient(
                    self.uri,
                    serverSelectionTimeoutMS=ms,
                    connectTimeoutMS=ms,
                    appname="mongo-saver-cli",
                )
        except ConfigurationError as exc:  # includes InvalidURI
            raise CliError(f"invalid MongoDB URI: {scrub(str(exc), self.uri)}") from None
        except (ValueError, TypeError) as exc:
            raise CliError(f"invalid MongoDB URI: {scrub(str(exc), self.uri)}") from None
        self._client = client
        try:
            client.admin.command("ping")
        except ServerSelectionTimeoutError:
            raise CliError(
                f"cannot reach a MongoDB server at {_uri_hosts(self.uri)} "
                f"within {self.timeout:g} s"
            ) from None
        return client

    def database(self) -> Any:
        return self.client()[self.db]

    def saver(self, *, write_back: bool = False) -> MongoSaver:
        """A saver on the settings; read-only unless a command exists to write."""
        return MongoSaver(
            self.client(),
            self.db,
            checkpoint_collection=self.checkpoint_collection,
            writes_collection=self.writes_collection,
            migrations=self._load_migrations(),
            write_back=write_back,
        )

    def _load_migrations(self) -> SchemaMigrations | None:
        if self.migrations is None:
            return None
        if not self.migrations.is_dir():
            raise CliError(f"--migrations {self.migrations}: not a directory")
        try:
            return load_migrations(self.migrations)
        except Exception as exc:  # a broken step file: report it in one line
            raise CliError(f"cannot load migrations from {self.migrations}: "
                           f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _settings(ctx: typer.Context) -> Settings:
    settings = ctx.find_root().obj
    assert isinstance(settings, Settings)
    return settings


err_console = Console(stderr=True, highlight=False)


def _console() -> Console:
    # Created per command so that test runners that swap sys.stdout see the output.
    return Console(file=sys.stdout, highlight=False, soft_wrap=False)


def _fail(message: str) -> NoReturn:
    err_console.print(Text(f"error: {message}"), soft_wrap=True)
    raise typer.Exit(1)


@contextlib.contextmanager
def _session(ctx: typer.Context) -> Iterator[Settings]:
    """Yield the settings; report any failure as one line and exit 1."""
    settings = _settings(ctx)
    uri = settings.uri
    try:
        yield settings
    except typer.Exit:
        raise
    except CliError as exc:
        _fail(str(exc))
    except SchemaVersionError as exc:
        hint = "" if settings.migrations else " (pass --migrations DIR with the newer steps)"
        _fail(scrub(str(exc), uri) + hint)
    except MongoSaverError as exc:
        _fail(scrub(str(exc), uri))
    except ServerSelectionTimeoutError:
        _fail(f"lost the MongoDB server at {_uri_hosts(uri or '')}")
    except OperationFailure as exc:
        if exc.code in (13, 18):
            _fail(f"MongoDB refused access: {scrub(str(exc.details or exc), uri)}")
        _fail(f"MongoDB error: {scrub(str(exc), uri)}")
    except PyMongoError as exc:
        _fail(f"MongoDB error: {scrub(str(exc), uri)}")
    except KeyboardInterrupt:
        _fail("interrupted")
    except Exception as exc:
        if os.environ.get("MONGO_SAVER_DEBUG"):
            raise
        _fail(f"unexpected {type(exc).__name__}: {scrub(str(exc), uri)}")
    finally:
        settings.close()


def _emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _spinner(message: str) -> contextlib.AbstractContextManager[Any]:
    if err_console.is_terminal:
        return err_console.status(message)
    return contextlib.nullcontext()


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    )


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return "-"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _versions(values: Sequence[Any]) -> str:
    return ", ".join("legacy" if v is None else str(v) for v in values) or "-"


def _config(thread_id: str, ns: str, checkpoint_id: str | None = None) -> Any:
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


# --- the app -----------------------------------------------------------------------------


@app.callback()
def main(
    ctx: typer.Context,
    uri: Annotated[
        str | None,
        typer.Option(
            "--uri",
            envvar="MONGODB_URI",
            show_envvar=True,
            show_default=False,
            help="MongoDB connection string.",
        ),
    ] = None,
    db: Annotated[str, typer.Option("--db", help="Database name.")] = "langgraph",
    checkpoint_collection: Annotated[
        str, typer.Option("--checkpoint-collection", help="Checkpoints collection.")
    ] = "checkpoints",
    writes_collection: Annotated[
        str, typer.Option("--writes-collection", help="Pending writes collection.")
    ] = "checkpoint_writes",
    migrations: Annotated[
        Path | None,
        typer.Option(
            "--migrations",
            envvar="MONGO_SAVER_MIGRATIONS",
            help="Folder of schema migration steps, so newer checkpoints can be read "
            "(read-only: nothing is written back).",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for the server.", min=0.1)
    ] = DEFAULT_TIMEOUT_S,
) -> None:
    """Inspect LangGraph checkpoints stored in MongoDB by mongo-saver."""
    ctx.obj = Settings(uri, db, checkpoint_collection, writes_collection, migrations, timeout)


@app.command()
def setup(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Create the collections' indexes (idempotent; run once per deploy)."""
    with _session(ctx) as s:
        saver = s.saver()
        with _spinner("Creating indexes..."):
            saver.setup()
        database = s.database()
        result: dict[str, Any] = {
            "database": s.db,
            "indexes": {
                name: [
                    {"name": ix["name"], "key": [[k, v] for k, v in ix["key"].items()],
                     "unique": bool(ix.get("unique", False))}
                    for ix in sorted(database[name].list_indexes(), key=lambda i: i["name"])
                ]
                for name in (s.checkpoint_collection, s.writes_collection)
            },
        }
    if as_json:
        _emit_json(result)
        return
    console = _console()
    for name, indexes in result["indexes"].items():
        console.print(f"{s.db}.{name}: {', '.join(ix['name'] for ix in indexes)}")
    console.print("Indexes are in place.")


@app.command()
def threads(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Threads to show.")] = 20,
    prefix: Annotated[
        str | None, typer.Option("--prefix", help="Only threads whose id starts with this.")
    ] = None,
    largest: Annotated[
        bool, typer.Option("--largest", help="Biggest threads first (stored bytes).")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Recently active (or largest) threads: checkpoints, writes, size, versions, activity."""
    with _session(ctx) as s:
        database = s.database()
        with _spinner("Reading threads..."):
            groups = list(database[s.checkpoint_collection].aggregate(
                insp.threads_pipeline(limit, prefix, largest)))
            writes = list(database[s.writes_collection].aggregate(
                insp.thread_writes_pipeline([g["_id"] for g in groups]))) if groups else []
        rows = insp.thread_rows(groups, writes)
    if as_json:
        _emit_json(rows)
        return
    console = _console()
    if not rows:
        console.print(f"No threads in {s.db}.{s.checkpoint_collection}.")
        return
    order = "largest first" if largest else "most recent first"
    table = Table(title=f"Threads in {s.db}.{s.checkpoint_collection} ({order})")
    table.add_column("thread", overflow="fold")
    table.add_column("checkpoints", justify="right")
    table.add_column("writes", justify="right")
    table.add_column("size", justify="right")
    table.add_column("schema", justify="center")
    table.add_column("format", justify="center")
    table.add_column("last activity (UTC)")
    for r in rows:
        table.add_row(
            r["thread_id"], str(r["checkpoints"]), str(r["writes"]), _size(r["size_bytes"]),
            _versions(r["schema_versions"]), _versions(r["formats"]),
            _short_time(r["last_activity"]),
        )
    console.print(table)


@app.command()
def history(
    ctx: typer.Context,
    thread: Annotated[str, typer.Argument(help="Thread id.")],
    ns: Annotated[str, typer.Option("--ns", help="Checkpoint namespace.")] = "",
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Checkpoints.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """A thread's checkpoints, newest first, like get_state_history but readable."""
    with _session(ctx) as s:
        saver = s.saver()
        tuples = []
        with _progress() as progress:
            task = progress.add_task("Reading checkpoints", total=limit)
            for t in saver.list(_config(thread, ns), limit=limit):
                tuples.append(t)
                progress.advance(task)
        if not tuples:
            raise CliError(_unknown_thread(s, thread, ns))
        where, projection = insp.checkpoint_facts_query(
            thread, ns, [t.checkpoint["id"] for t in tuples])
        facts = insp.checkpoint_facts(
            s.database()[s.checkpoint_collection].find(where, projection))
        rows = insp.history_rows(tuples, facts)
    if as_json:
        _emit_json(rows)
        return
    console = _console()
    # Narrow terminals drop the optional columns; the checkpoint id always stays whole.
    wide, medium = console.width >= 145, console.width >= 125
    table = Table(title=f"History of thread {thread!r}" + (f" ns {ns!r}" if ns else "")
                  + " (newest first)", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("source", no_wrap=True)
    table.add_column("next", min_width=9)
    table.add_column("changed", min_width=10)
    table.add_column("writes", justify="right", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    if medium:
        table.add_column("schema", justify="center", no_wrap=True)
        table.add_column("created (UTC)", no_wrap=True)
    table.add_column("checkpoint id", overflow="fold", no_wrap=medium)
    if wide:
        table.add_column("parent", no_wrap=True)
    for r in rows:
        writes = str(r["pending_writes"]) + (f" ({r['errors']} error)" if r["errors"] else "")
        cells = [
            str(r["step"]), str(r["source"] or "-"), ", ".join(r["next"]) or "-",
            ", ".join(r["changed"]) or "-", writes, _size(r["size_bytes"]),
        ]
        if medium:
            cells += [_versions([r["schema_version"]]), _short_time(r["created_at"])]
        cells.append(r["checkpoint_id"])
        if wide:
            cells.append(_parent_label(r["parent_checkpoint_id"], rows, r))
        table.add_row(*cells)
    console.print(table)


def _parent_label(parent: str | None, rows: Sequence[dict[str, Any]], row: Any) -> str:
    """`"previous row"` on a straight line, else the parent's id suffix (a fork point)."""
    if parent is None:
        return "-"
    index = next(i for i, r in enumerate(rows) if r is row)
    if index + 1 < len(rows) and rows[index + 1]["checkpoint_id"] == parent:
        return "\N{DOWNWARDS ARROW}"
    return "..." + parent[-8:]


def _short_time(value: Any) -> str:
    """`2026-11-30T07:04:33+00:00` as `2026-11-30 07:04:33` (the table says UTC)."""
    return str(value or "-").replace("+00:00", "").replace("T", " ")


def _unknown_thread(s: Settings, thread: str, ns: str) -> str:
    where = f" namespace {ns!r}" if ns else ""
    return f"thread {thread!r}{where} not found in {s.db}.{s.checkpoint_collection}"


def _resolve_id(s: Settings, thread: str, ns: str, given: str) -> str:
    """A full checkpoint id from a full id or a unique prefix of one."""
    found = [
        d["checkpoint_id"]
        for d in s.database()[s.checkpoint_collection].find(
            insp.prefix_query(thread, ns, given), {"_id": 0, "checkpoint_id": 1}, limit=5)
    ]
    if given in found:
        return given
    if not found:
        if s.database()[s.checkpoint_collection].find_one({"thread_id": thread}) is None:
            raise CliError(_unknown_thread(s, thread, ns))
        raise CliError(f"checkpoint {given!r} not found in thread {thread!r}")
    if len(found) > 1:
        raise CliError(f"checkpoint prefix {given!r} is ambiguous in thread {thread!r}")
    return str(found[0])


def _load(s: Settings, saver: MongoSaver, thread: str, ns: str, checkpoint: str | None) -> Any:
    checkpoint_id = _resolve_id(s, thread, ns, checkpoint) if checkpoint else None
    found = saver.get_tuple(_config(thread, ns, checkpoint_id))
    if found is None:
        raise CliError(_unknown_thread(s, thread, ns))
    return found


@app.command()
def show(
    ctx: typer.Context,
    thread: Annotated[str, typer.Argument(help="Thread id.")],
    checkpoint: Annotated[
        str | None, typer.Argument(help="Checkpoint id or unique prefix (default: latest).")
    ] = None,
    ns: Annotated[str, typer.Option("--ns", help="Checkpoint namespace.")] = "",
    all_channels: Annotated[
        bool, typer.Option("--all-channels", help="Include LangGraph's internal channels.")
    ] = False,
    max_items: Annotated[
        int, typer.Option("--max-items", min=1, help="Truncate longer lists.")
    ] = 20,
    max_string: Annotated[
        int, typer.Option("--max-string", min=10, help="Truncate longer strings.")
    ] = 300,
    as_json: JsonOpt = False,
) -> None:
    """A checkpoint's state (channel values) and pending writes."""
    with _session(ctx) as s:
        saver = s.saver()
        t = _load(s, saver, thread, ns, checkpoint)
        checkpoint_id = t.checkpoint["id"]
        nodes = insp.task_nodes(s.database()[s.writes_collection].find(
            insp.task_nodes_query(thread, ns, checkpoint_id),
            {"_id": 0, "task_id": 1, "task_path": 1}))
        where, projection = insp.checkpoint_facts_query(thread, ns, [checkpoint_id])
        facts = insp.checkpoint_facts(s.database()[s.checkpoint_collection].find(
            where, projection)).get(checkpoint_id)
        view = insp.state_view(t, include_internal=all_channels, nodes=nodes, facts=facts)
    if as_json:
        _emit_json(view)
        return
    console = _console()
    meta = view["metadata"] or {}
    header = Table.grid(padding=(0, 2))
    header.add_column(style="bold")
    header.add_column(overflow="fold")
    header.add_row("thread", view["thread_id"] + (f"  ns {view['checkpoint_ns']!r}"
                                                  if view["checkpoint_ns"] else ""))
    header.add_row("checkpoint", view["checkpoint_id"])
    header.add_row("parent", view["parent_checkpoint_id"] or "-")
    header.add_row("step / source", f"{meta.get('step')} / {meta.get('source')}")
    header.add_row("next (derived)", ", ".join(view["next"]) or "-")
    header.add_row("stored", f"{_size(view.get('size_bytes'))}, schema "
                   f"{_versions([view.get('schema_version')])}, created "
                   f"{view.get('created_at') or view['ts']}")
    console.print(Panel(header, title="Checkpoint", expand=False))

    def pretty(value: Any) -> Pretty:
        return Pretty(value, max_length=max_items, max_string=max_string, expand_all=False)

    values = Table(title="Channel values", show_lines=True)
    values.add_column("channel", no_wrap=True)
    values.add_column("value", overflow="fold")
    for channel, value in view["values"].items():
        values.add_row(channel, pretty(value))
    console.print(values if view["values"] else Text("No channel values."))
    if view["pending_writes"]:
        writes = Table(title="Pending writes (waiting for the next step)", show_lines=True)
        writes.add_column("node / task", overflow="fold")
        writes.add_column("channel", no_wrap=True)
        writes.add_column("value", overflow="fold")
        for w in view["pending_writes"]:
            writes.add_row(w["node"] or w["task_id"][:8], w["channel"], pretty(w["value"]))
        console.print(writes)
    else:
        console.print("No pending writes.")


@app.command()
def diff(
    ctx: typer.Context,
    thread: Annotated[str, typer.Argument(help="Thread id.")],
    a: Annotated[str, typer.Argument(help="Older checkpoint id (or unique prefix).")],
    b: Annotated[
        str | None, typer.Argument(help="Newer checkpoint id; default: latest.")
    ] = None,
    ns: Annotated[str, typer.Option("--ns", help="Checkpoint namespace.")] = "",
    all_channels: Annotated[
        bool, typer.Option("--all-channels", help="Include LangGraph's internal channels.")
    ] = False,
    show_unchanged: Annotated[
        bool, typer.Option("--unchanged", help="Also list unchanged channels.")
    ] = False,
    max_items: Annotated[int, typer.Option("--max-items", min=1)] = 10,
    max_string: Annotated[int, typer.Option("--max-string", min=10)] = 200,
    as_json: JsonOpt = False,
) -> None:
    """What changed between two checkpoints of a thread, channel by channel."""
    with _session(ctx) as s:
        saver = s.saver()
        ta = _load(s, saver, thread, ns, a)
        tb = _load(s, saver, thread, ns, b)
        before = insp.to_jsonable(ta.checkpoint.get("channel_values", {}))
        after = insp.to_jsonable(tb.checkpoint.get("channel_values", {}))
        rows = insp.diff_values(before, after, include_internal=all_channels)
        result: dict[str, Any] = {
            "thread_id": thread,
            "checkpoint_ns": ns,
            "a": {"checkpoint_id": ta.checkpoint["id"], "step": (ta.metadata or {}).get("step")},
            "b": {"checkpoint_id": tb.checkpoint["id"], "step": (tb.metadata or {}).get("step")},
            "channels": rows,
        }
    if as_json:
        _emit_json(result)
        return
    console = _console()
    shown = [r for r in rows if show_unchanged or r["change"] != "unchanged"]
    title = (f"Thread {thread!r}: step {result['a']['step']} ({ta.checkpoint['id']}) -> "
             f"step {result['b']['step']} ({tb.checkpoint['id']})")
    if not shown:
        console.print(title)
        console.print("No channel changed.")
        return
    table = Table(title=title, show_lines=True)
    table.add_column("channel", no_wrap=True)
    table.add_column("change")
    table.add_column("detail", overflow="fold")

    def pretty(value: Any) -> Pretty:
        return Pretty(value, max_length=max_items, max_string=max_string)

    for r in shown:
        change = r["change"]
        detail: Any = ""
        if change in ("appended", "truncated"):
            verb = "+" if change == "appended" else "-"
            detail = Group(Text(f"{verb}{r['count']} item(s):"), pretty(r["items"]))
        elif change == "added":
            detail = pretty(r["after"])
        elif change == "removed":
            detail = pretty(r["before"])
        elif change == "changed":
            parts: list[Any] = [Text(r["detail"])] if r.get("detail") else []
            if "removed" in r:
                parts += [Text("removed:"), pretty(r["removed"]),
                          Text("added:"), pretty(r["added"])]
            else:
                parts += [Text("before:"), pretty(r["before"]),
                          Text("after:"), pretty(r["after"])]
            detail = Group(*parts)
        table.add_row(r["channel"], change, detail)
    console.print(table)


@app.command()
def stats(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Counts, sizes and documents per format and schema version across the database."""
    with _session(ctx) as s:
        database = s.database()
        checkpoints = database[s.checkpoint_collection]
        writes = database[s.writes_collection]
        queries: list[tuple[str, Any, list[dict[str, Any]]]] = [
            ("checkpoint versions", checkpoints, insp.checkpoint_versions_pipeline()),
            ("write versions", writes, insp.write_versions_pipeline()),
            ("threads", checkpoints, insp.thread_count_pipeline()),
            ("value entries", checkpoints, insp.value_kinds_pipeline()),
        ]
        results = []
        with _progress() as progress:
            task = progress.add_task("Collecting statistics", total=len(queries))
            for name, collection, pipeline in queries:
                progress.update(task, description=f"Counting {name}")
                results.append(list(collection.aggregate(pipeline)))
                progress.advance(task)
        summary = {"database": s.db, **insp.stats_summary(*results)}
    if as_json:
        _emit_json(summary)
        return
    console = _console()
    overview = Table(title=f"Database {s.db}", show_header=False)
    overview.add_column(style="bold")
    overview.add_column(justify="right")
    overview.add_row("threads", str(summary["threads"]))
    overview.add_row("checkpoints", str(summary["checkpoints"]))
    overview.add_row("pending writes", str(summary["writes"]))
    overview.add_row("checkpoint bytes", _size(summary["size_bytes"]))
    overview.add_row("average checkpoint", _size(summary["average_checkpoint_bytes"]))
    overview.add_row("largest checkpoint", _size(summary["largest_checkpoint_bytes"]))
    console.print(overview)
    by_version = Table(title=f"{s.checkpoint_collection} by version")
    for name in ("format", "schema", "checkpoints", "threads", "size", "largest"):
        by_version.add_column(name, justify="right")
    for r in summary["checkpoints_by_version"]:
        by_version.add_row(_versions([r["format"]]), _versions([r["schema_version"]]),
                           str(r["checkpoints"]), str(r["threads"]), _size(r["size_bytes"]),
                           _size(r["largest_bytes"]))
    console.print(by_version)
    if summary["writes_by_version"]:
        w = Table(title=f"{s.writes_collection} by version")
        for name in ("format", "schema", "writes"):
            w.add_column(name, justify="right")
        for r in summary["writes_by_version"]:
            w.add_row(_versions([r["format"]]), _versions([r["schema_version"]]),
                      str(r["writes"]))
        console.print(w)
    if summary["value_entries"]:
        kinds = Table(title="Stored channel values by kind")
        for name in ("kind", "entries", "payload"):
            kinds.add_column(name, justify="right")
        for r in summary["value_entries"]:
            kinds.add_row(str(r["kind"]), str(r["entries"]), _size(r["bytes"]))
        console.print(kinds)


# --- maintenance ---------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> dt.timedelta:
    """`"90m"`, `"12h"`, `"30d"`, `"2w"` or plain seconds, as a positive timedelta."""
    match = _DURATION.match(text.lower())
    if not match or float(match.group(1)) <= 0:
        raise CliError(f"invalid duration {text!r}: use e.g. 3600, 90m, 12h, 30d or 2w")
    return dt.timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


@app.command()
def check(
    ctx: typer.Context,
    thread_ids: Annotated[
        list[str] | None, typer.Argument(help="Threads to check (default: every thread).")
    ] = None,
    repair: Annotated[
        bool, typer.Option("--repair", help="Delete orphan writes older than --grace.")
    ] = False,
    grace: Annotated[
        str, typer.Option("--grace", help="Orphan writes younger than this are kept.")
    ] = "5m",
    as_json: JsonOpt = False,
) -> None:
    """Integrity check: holes in parent chains, orphan writes, missing values, versions.

    Exit status 0 when clean (forks from time travel are reported but allowed), 2 when
    there are findings, 1 on errors.
    """
    with _session(ctx) as s:
        saver = s.saver()
        with _spinner("Checking threads..."):
            report = saver.check_integrity(
                thread_ids or None, repair=repair, repair_grace=parse_duration(grace)
            )
    repaired = set(report.repaired)
    findings: list[dict[str, Any]] = [
        {"kind": f.kind, "thread_id": f.thread_id, "checkpoint_ns": f.checkpoint_ns,
         "checkpoint_id": f.checkpoint_id, "detail": f.detail, "repaired": f in repaired}
        for f in report.findings
    ]
    if as_json:
        _emit_json({
            "clean": report.clean, "linear": report.linear,
            "threads_checked": report.threads_checked,
            "checkpoints_checked": report.checkpoints_checked,
            "writes_checked": report.writes_checked,
            "findings": findings,
        })
    else:
        console = _console()
        if findings:
            table = Table(title="Findings")
            for name in ("kind", "thread", "ns", "checkpoint", "detail"):
                table.add_column(name, overflow="fold")
            for f in findings:
                table.add_row(f["kind"] + (" (repaired)" if f["repaired"] else ""),
                              f["thread_id"], f["checkpoint_ns"] or "-",
                              f["checkpoint_id"] or "-", f["detail"])
            console.print(table)
        console.print(("clean: " if report.clean else "NOT clean: ") + report.summary())
    if not report.clean:
        raise typer.Exit(2)


@app.command()
def expire(
    ctx: typer.Context,
    idle: Annotated[
        str, typer.Option("--idle", help="Delete threads idle this long (e.g. 30d, 12h).")
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only list the threads that would go.")
    ] = False,
    limit: Annotated[
        int | None, typer.Option("--limit", min=0, help="At most this many threads.")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Really delete (no prompt).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete, whole, every thread whose newest checkpoint is older than --idle.

    Threads whose lease is held are skipped. Without --dry-run this deletes data, so it
    needs --yes.
    """
    with _session(ctx) as s:
        duration = parse_duration(idle)
        if not dry_run and not yes:
            raise CliError("expire deletes threads: pass --yes, or --dry-run to preview")
        saver = s.saver()
        with _spinner("Expiring idle threads..."):
            report = saver.expire_idle_threads(duration, dry_run=dry_run, limit=limit)
    result: dict[str, Any] = {
        "dry_run": report.dry_run,
        "cutoff": insp.iso(report.cutoff),
        "expired": [
            {"thread_id": e.thread_id, "newest": insp.iso(e.newest),
             "checkpoints_deleted": e.checkpoints_deleted, "writes_deleted": e.writes_deleted}
            for e in report.expired
        ],
        "skipped_busy": report.skipped_busy,
        "skipped_active": report.skipped_active,
    }
    if as_json:
        _emit_json(result)
        return
    console = _console()
    verb = "would expire" if dry_run else "expired"
    if result["expired"]:
        table = Table(title=f"Threads idle since before {result['cutoff']} ({verb})")
        for name in ("thread", "newest checkpoint", "checkpoints", "writes"):
            table.add_column(name, overflow="fold")
        for e in result["expired"]:
            table.add_row(e["thread_id"], str(e["newest"]),
                          "-" if dry_run else str(e["checkpoints_deleted"]),
                          "-" if dry_run else str(e["writes_deleted"]))
        console.print(table)
    console.print(f"{len(result['expired'])} thread(s) {verb}; "
                  f"{len(report.skipped_busy)} skipped (lease held), "
                  f"{len(report.skipped_active)} skipped (became active).")




def _status_rows(saver: MongoSaver) -> list[dict[str, Any]]:
    current = saver.core.upgrader.current_schema_version
    rows = []
    for row in saver.migration_status():
        if row["format"] > FORMAT_VERSION or row["schema_version"] > current:
            state = "newer than this code"
        elif row["format"] < FORMAT_VERSION or row["schema_version"] < current:
            state = "outdated"
        else:
            state = "current"
        rows.append({**row, "state": state})
    return rows


@app.command("migration-status")
def migration_status(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Documents per collection, storage format and schema version (format 0 = legacy)."""
    with _session(ctx) as s:
        saver = s.saver()
        rows = _status_rows(saver)
        current = saver.core.upgrader.current_schema_version
    if as_json:
        _emit_json({"current_format": FORMAT_VERSION, "current_schema_version": current,
                    "rows": rows})
        return
    table = Table(title=f"Versions (this code: format {FORMAT_VERSION}, schema {current})")
    for name in ("collection", "format", "schema", "documents", "state"):
        table.add_column(name)
    for row in rows:
        table.add_row(row["collection"], str(row["format"]), str(row["schema_version"]),
                      f"{row['documents']:,}", row["state"])
    _console().print(table)


@app.command()
def migrate(
    ctx: typer.Context,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Thread ids fetched per query.")
    ] = 100,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Read and migrate in memory; write nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Upgrade every outdated checkpoint now instead of on its next read.

    Resumable: it only selects documents still below the current version, so after a
    crash run it again. Exit status 2 if a step failed on some thread (those threads are
    left exactly as they were and listed).
    """
    with _session(ctx) as s:
        saver = s.saver(write_back=not dry_run)
        outdated = sum(r["documents"] for r in _status_rows(saver)
                       if r["state"] == "outdated" and r["collection"] == saver.core.checkpoints)
        with _progress() as progress:
            task = progress.add_task("Migrating checkpoints", total=outdated)
            report = saver.migrate(batch_size=batch_size, dry_run=dry_run,
                                   on_checkpoint=lambda: progress.advance(task))
    result = {"dry_run": report.dry_run, "threads": report.threads,
              "checkpoints": report.checkpoints, "failures": report.failures}
    if as_json:
        _emit_json(result)
    else:
        console = _console()
        verb = "checked (dry run)" if report.dry_run else "migrated"
        console.print(f"{verb}: {report.checkpoints:,} checkpoints in {report.threads:,} threads")
        for failure in report.failures:
            console.print(Text(f"failed: {failure}"))
    if report.failures:
        raise typer.Exit(2)


if __name__ == "__main__":
    app()
