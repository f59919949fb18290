"""Run the whole benchmark on one server and write JSON, plots and the docs page.

    python -m benchmarks.run [--quick] [--out docs/benchmarks] [--page docs/benchmarks.md]

Starts a local SecantusDB server (``--server mongoeco`` for the other test server) unless
``MONGODB_URI`` is set, runs every saver through every scenario, each saver in a fresh
database, then prints PASS/FAIL for the targets of issue 6. Nothing here asserts: a missed
target is reported, not raised.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.metadata
import json
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pymongo import MongoClient

from benchmarks import report, scenarios
from benchmarks.graphs import chat_graph, counter_graph, counter_input, turn_input
from benchmarks.savers import (
    INCUMBENT,
    MEMORY,
    OURS_ASYNC,
    OURS_MOTOR,
    OURS_SYNC,
    SaverHandle,
    amake_saver,
    make_saver,
    motor_available,
)

ROOT = Path(__file__).resolve().parent.parent
SYNC_KINDS = (OURS_SYNC, INCUMBENT, MEMORY)
STORED_AT_TURN = 200


def _log(start: float, message: str) -> None:
    print(f"[{time.monotonic() - start:7.1f}s] {message}", flush=True)


def with_no_retryable_writes(uri: str) -> str:
    parts = urlsplit(uri)
    query = dict(parse_qsl(parts.query))
    query.setdefault("retryWrites", "false")
    return urlunsplit(parts._replace(query=urlencode(query)))


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(uri: str, server_kind: str, stats_client: MongoClient[Any]) -> dict[str, Any]:
    server: dict[str, Any] = {"kind": server_kind}
    try:
        info = stats_client.server_info()
        server["version"] = info.get("version")
    except Exception as error:  # mongoeco has no buildinfo
        server["version"] = None
        server["version_error"] = type(error).__name__
    try:
        hello = stats_client.admin.command("hello")
        server["max_wire_version"] = hello.get("maxWireVersion")
        server["set_name"] = hello.get("setName")
    except Exception:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        commit = None
    versions = {d: _version(d) for d in (
        "mongo-saver", "langgraph", "langgraph-checkpoint", "langgraph-checkpoint-mongodb",
        "langchain-core", "pymongo", "motor", "matplotlib")}
    if versions["mongo-saver"] is None:
        versions["mongo-saver"] = f"source tree {commit or 'unknown'}"
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "server": server,
        "uri_host": urlsplit(uri).hostname,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "libraries": versions,
        "git_commit": commit,
    }


class Bench:
    def __init__(self, args: argparse.Namespace, uri: str, stats_client: MongoClient[Any]):
        self.args = args
        self.uri = uri
        self.stats = stats_client
        self.start = time.monotonic()
        self.errors: list[dict[str, str]] = []

    def log(self, message: str) -> None:
        _log(self.start, message)

    def _guard(self, scenario: str, kind: str, fn: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        try:
            result = fn()
        except Exception as error:  # keep going: one broken saver must not hide the others
            import traceback

            traceback.print_exc()
            self.errors.append({"scenario": scenario, "saver": kind,
                                "error": f"{type(error).__name__}: {error}"})
            self.log(f"  {scenario} / {kind}: FAILED ({type(error).__name__}: {error})")
            return None
        self.log(f"  {scenario} / {kind}: {time.monotonic() - t0:.1f}s")
        return result

    def each(self, scenario: str, kinds: tuple[str, ...],
             body: Callable[[SaverHandle], Any]) -> dict[str, Any]:
        """Run an async ``body(handle)`` for every saver, each in a fresh database."""

        async def one(kind: str) -> Any:
            handle = await amake_saver(kind, self.uri, scenario, self.stats)
            try:
                return await body(handle)
            finally:
                await handle.aclose()

        out: dict[str, Any] = {}
        for kind in kinds:
            result = self._guard(scenario, kind, lambda k=kind: asyncio.run(one(k)))
            if result is not None:
                out[kind] = result
        return out

    def chats(self, scenario: str, kinds: tuple[str, ...], turns: dict[str, int], *,
              delta: bool, snapshot_frequency: int = 100) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind in kinds:
            n = turns[kind]
            at_turn = self.args.stored_at_turn
            stored_at = [at_turn] if n >= at_turn else [n]

            def sync_run(k: str = kind, n: int = n, at: list[int] = stored_at) -> Any:
                handle = make_saver(k, self.uri, scenario, self.stats)
                try:
                    return scenarios.chat_sync(handle, n, delta=delta, stored_at=at,
                                               snapshot_frequency=snapshot_frequency)
                finally:
                    asyncio.run(handle.aclose())

            async def async_run(k: str = kind, n: int = n, at: list[int] = stored_at) -> Any:
                handle = await amake_saver(k, self.uri, scenario, self.stats)
                try:
                    return await scenarios.chat_async(handle, n, delta=delta, stored_at=at,
                                                      snapshot_frequency=snapshot_frequency)
                finally:
                    await handle.aclose()

            if kind in SYNC_KINDS:
                result = self._guard(scenario, kind, sync_run)
            else:
                result = self._guard(scenario, kind, lambda r=async_run: asyncio.run(r()))
            if result is not None:
                out[kind] = result
        return out


def run(args: argparse.Namespace, uri: str, server_kind: str) -> dict[str, Any]:
    stats_client: MongoClient[Any] = MongoClient(uri, serverSelectionTimeoutMS=30_000)
    bench = Bench(args, uri, stats_client)
    quick = args.quick
    params = {
        "mode": "quick" if quick else "full",
        "chat_turns": args.turns or (200 if quick else 1000),
        "incumbent_chat_turns": None,
        "delta_chat_turns": STORED_AT_TURN,
        "ops_sizes": [10, 100, 1000],
        "ops_reps": 3 if quick else 10,
        "list_checkpoints": 1000,
        "list_reps": 3 if quick else 10,
        "delta_depths": [10, 100, 1000],
        "delta_reps": 2 if quick else 5,
        "concurrent_threads": 20,
        "concurrent_turns": 20,
        "stored_at_turn": STORED_AT_TURN,
        "message_chars": 200,
    }
    if args.smoke:  # a seconds-long run of every code path, numbers meaningless
        params.update(chat_turns=args.turns or 12, delta_chat_turns=12, ops_sizes=[10, 100],
                      ops_reps=1, list_checkpoints=30, list_reps=1, delta_depths=[10, 30],
                      delta_reps=1, concurrent_threads=3, concurrent_turns=3,
                      stored_at_turn=12)
        params["mode"] = "smoke"
    args.stored_at_turn = params["stored_at_turn"]
    params["incumbent_chat_turns"] = min(args.incumbent_turns or params["chat_turns"],
                                         params["chat_turns"])
    results: dict[str, Any] = {"parameters": params}
    results["environment"] = environment(uri, server_kind, stats_client)
    bench.log(f"server {server_kind} {results['environment']['server'].get('version')}; "
              f"mode {params['mode']}")
    all_kinds = (OURS_SYNC, OURS_ASYNC, INCUMBENT, MEMORY)

    bench.log("operations: put / put_writes / get_tuple at 10, 100, 1,000 messages")
    results["operations"] = bench.each(
        "ops", all_kinds,
        lambda h: scenarios.operations(h, params["ops_sizes"], params["ops_reps"]))

    bench.log("list(limit=10) over a 1,000-checkpoint thread")
    list_turns = -(-params["list_checkpoints"] // 3)
    list_source = scenarios.record_thread(counter_graph(), list_turns, counter_input)
    results["list"] = bench.each(
        "list", all_kinds, lambda h: scenarios.listing(h, list_source, params["list_reps"]))

    bench.log("DeltaChannel history at depth 10 / 100 / 1,000")
    depth = max(params["delta_depths"])
    delta_source = scenarios.record_thread(
        chat_graph(delta=True, snapshot_frequency=10**6), -(-depth // 3), turn_input)
    results["delta_history"] = bench.each(
        "delta", all_kinds,
        lambda h: scenarios.delta_history(h, delta_source, params["delta_depths"],
                                          params["delta_reps"]))

    turns = {k: params["chat_turns"] for k in all_kinds}
    turns[INCUMBENT] = params["incumbent_chat_turns"]
    bench.log(f"chat, plain add_messages: {params['chat_turns']} turns "
              f"(incumbent {turns[INCUMBENT]})")
    results["chat"] = bench.chats("chat", all_kinds, turns, delta=False)

    delta_turns = {k: params["delta_chat_turns"] for k in all_kinds}
    bench.log(f"chat, messages as a DeltaChannel: {params['delta_chat_turns']} turns")
    results["chat_delta"] = bench.chats("chatdelta", all_kinds, delta_turns, delta=True)

    conc_kinds = (OURS_ASYNC, *((OURS_MOTOR,) if motor_available() else ()), INCUMBENT, MEMORY)
    bench.log(f"{params['concurrent_threads']} threads x {params['concurrent_turns']} turns "
              "concurrently (asyncio.gather over ainvoke)")
    results["concurrent"] = bench.each(
        "conc", conc_kinds,
        lambda h: scenarios.concurrent_chats(h, params["concurrent_threads"],
                                             params["concurrent_turns"]))
    results["errors"] = bench.errors
    results["elapsed_s"] = time.monotonic() - bench.start
    stats_client.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="200-turn chat and fewer repetitions (a few minutes)")
    parser.add_argument("--out", default="docs/benchmarks",
                        help="directory for results.json and the PNG plots")
    parser.add_argument("--page", default="docs/benchmarks.md",
                        help="markdown page whose generated section is refreshed")
    parser.add_argument("--server", choices=("secantus", "mongoeco"), default="secantus",
                        help="local test server to start when MONGODB_URI is not set")
    parser.add_argument("--turns", type=int, default=None,
                        help="chat turns (default 1,000; 200 with --quick)")
    parser.add_argument("--incumbent-turns", type=int, default=None,
                        help="cap the incumbent's plain chat (it rewrites the whole state "
                             "every checkpoint, so its cost grows with the square of turns)")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # The 1,000-message checkpoints are large on purpose; the saver's size warning is noise.
    logging.getLogger("mongo_saver").setLevel(logging.ERROR)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    server = None
    if os.environ.get("MONGODB_URI"):
        uri, server_kind = with_no_retryable_writes(os.environ["MONGODB_URI"]), "external"
    else:
        sys.path.insert(0, str(ROOT / "scripts"))
        from servers import start_server

        server = start_server(args.server)
        uri, server_kind = server.uri, args.server
    try:
        results = run(args, uri, server_kind)
    finally:
        if server is not None:
            server.stop()

    checks = report.targets(results)
    results["targets"] = [c.to_dict() for c in checks]
    results["headline"] = report.headline(results)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    plots = report.plots(results, out_dir)
    page = Path(args.page)
    report.update_page(page, report.markdown(results, checks, plots, page))
    print()
    print(report.text_summary(results))
    print()
    for check in checks:
        print(check.line())
    print(f"\nwrote {out_dir / 'results.json'}, {len(plots)} plots, {page}")
    if results["errors"]:
        print(f"{len(results['errors'])} scenario(s) failed; see 'errors' in results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
