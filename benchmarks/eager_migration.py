"""The eager migration command on many old checkpoints: documents per second, peak memory.

    python -m benchmarks.eager_migration [--checkpoints 10000] [--threads 100]

Writes `--checkpoints` schema-v1 checkpoints (the v1 graph's state: messages, a
`retrieved_context` list and a `route`), spread over `--threads` threads, straight
through `MongoSaver.put` so the setup is quick, then runs `MongoSaver.migrate` with the
project's `migrations/` folder and reports throughput and the peak of Python memory
(tracemalloc) during the migration. On the SecantusDB test server the throughput is bound
by the server's evaluation of the read aggregation's `$lookup` stages (most of the time,
measured), not by the write-backs; real MongoDB answers those from indexes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from pymongo import MongoClient
from rich.progress import Progress

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from servers import start_server  # noqa: E402

from mongo_saver import MongoSaver  # noqa: E402
from mongo_saver.core import next_version  # noqa: E402
from mongo_saver.migrations import load_migrations  # noqa: E402


def write_old_threads(saver: MongoSaver, checkpoints: int, threads: int) -> None:
    per_thread = checkpoints // threads
    with Progress() as progress:
        task = progress.add_task("writing v1 checkpoints", total=per_thread * threads)
        for t in range(threads):
            config: dict[str, Any] = {"configurable": {"thread_id": f"old-{t:05}",
                                                       "checkpoint_ns": ""}}
            checkpoint = empty_checkpoint()
            messages: list[Any] = []
            context: list[str] = []
            for step in range(per_thread):
                messages = [*messages, HumanMessage(f"question {step}", id=f"h{step}"),
                            AIMessage(f"answer {step}", id=f"a{step}")]
                context = [*context, f"document {step} of thread {t}"]
                values = {"messages": messages, "retrieved_context": context,
                          "route": "faq" if step % 2 else "chat"}
                versions = {ch: next_version(checkpoint["channel_versions"].get(ch))
                            for ch in values}
                checkpoint = {**checkpoint, "id": str(uuid.uuid1()), "channel_values": values,
                              "channel_versions": versions}
                config = saver.put(config, checkpoint, {"source": "loop", "step": step},
                                   versions)
                progress.advance(task)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    args = parser.parse_args()
    server = None if os.environ.get("MONGODB_URI") else start_server("secantus")
    uri = os.environ.get("MONGODB_URI") or server.uri  # type: ignore[union-attr]
    client: MongoClient[Any] = MongoClient(uri)
    db = f"bench_migration_{uuid.uuid4().hex[:8]}"
    try:
        writer = MongoSaver(client, db_name=db)
        writer.setup()
        write_old_threads(writer, args.checkpoints, args.threads)
        saver = MongoSaver(client, db_name=db, migrations=load_migrations(REPO / "migrations"))
        tracemalloc.start()
        started = time.perf_counter()
        with Progress() as progress:
            task = progress.add_task("migrating", total=args.checkpoints)
            report = saver.migrate(on_checkpoint=lambda: progress.advance(task))
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        result = {
            "checkpoints": report.checkpoints,
            "threads": report.threads,
            "failures": len(report.failures),
            "seconds": round(seconds, 2),
            "documents_per_second": round(report.checkpoints / seconds, 1),
            "peak_python_memory_mb": round(peak / 2**20, 1),
            "status_after": saver.migration_status(),
        }
        print(json.dumps(result, indent=2))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "eager_migration.json").write_text(json.dumps(result, indent=2) + "\n")
    finally:
        client.drop_database(db)
        client.close()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
