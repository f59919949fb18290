"""Run mongoeco as a MongoDB wire-protocol server until SIGTERM or SIGINT.

Run by the interpreter of ``.venv-mongoeco`` (mongoeco needs Python 3.13+); started by
``scripts/servers.py``, which waits for the ``listening`` line this script prints:

    .venv-mongoeco/bin/python scripts/mongoeco_server.py --port 27999 [--storage DIR]

Without ``--storage`` data lives in memory (the engine the tests use); with it, in a SQLite
file inside DIR, so that it survives a restart.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from mongoeco.engines.memory import MemoryEngine
from mongoeco.engines.sqlite import SQLiteEngine
from mongoeco.wire.proxy import AsyncMongoEcoProxyServer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--storage", default=None, help="directory for a SQLite database file")
    return parser.parse_args(argv)


async def serve(host: str, port: int, storage: str | None) -> None:
    if storage is None:
        engine: MemoryEngine | SQLiteEngine = MemoryEngine()
    else:
        directory = Path(storage)
        directory.mkdir(parents=True, exist_ok=True)
        engine = SQLiteEngine(str(directory / "mongoeco.sqlite3"), executor_workers=1)
    server = AsyncMongoEcoProxyServer(
        engine=engine,
        host=host,
        port=port,
        mongodb_dialect="7.0",
        pymongo_profile="auto-installed",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    address = await server.start()
    print(f"mongoeco listening on {address.host}:{address.port}", flush=True)
    try:
        await stop.wait()
    finally:
        print("mongoeco shutting down", flush=True)
        await server.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    asyncio.run(serve(args.host, args.port, args.storage))
    return 0


if __name__ == "__main__":
    sys.exit(main())
