"""Shared pytest fixtures."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

# =========================================================================================
# Test server: one MongoDB wire-protocol server per test session.
#
# MONGODB_URI set             -> use that server (real MongoDB, Atlas, ...) and start nothing
# MONGO_SAVER_TEST_SERVER     -> "secantus" (default) or "mongoeco": the local server that
#                                scripts/servers.py starts on a free port (run
#                                scripts/bootstrap first to install it)
# =========================================================================================

REPO_ROOT = Path(__file__).resolve().parent.parent
_SCRIPTS_DIR = str(REPO_ROOT / "scripts")
if _SCRIPTS_DIR not in sys.path:
    sys.path.insert(0, _SCRIPTS_DIR)

from servers import KINDS, start_server  # noqa: E402


@pytest.fixture(scope="session")
def server_kind() -> str:
    """``"external"`` when ``MONGODB_URI`` is set, else the local server's kind."""
    if os.environ.get("MONGODB_URI"):
        return "external"
    kind = os.environ.get("MONGO_SAVER_TEST_SERVER", "secantus")
    if kind not in KINDS:
        raise pytest.UsageError(
            f"MONGO_SAVER_TEST_SERVER={kind!r}: expected one of {', '.join(KINDS)}"
        )
    return kind


@pytest.fixture(scope="session")
def mongodb_uri(server_kind: str) -> Iterator[str]:
    """URI of the session's server; a local one is started once and stopped at the end."""
    if server_kind == "external":
        yield os.environ["MONGODB_URI"]
        return
    server = start_server(server_kind)
    try:
        yield server.uri
    finally:
        server.stop()


@pytest.fixture
def db_name() -> str:
    """A database name no other test uses."""
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def sync_client(mongodb_uri: str) -> Iterator[MongoClient[dict[str, Any]]]:
    """A pymongo ``MongoClient`` on the session's server, closed at the end."""
    client: MongoClient[dict[str, Any]] = MongoClient(mongodb_uri, serverSelectionTimeoutMS=15_000)
    try:
        yield client
    finally:
        client.close()


# --- saver fixtures below ---

SAVER_KINDS = ("sync", "pymongo-async", "motor")


@pytest.fixture
def make_sync_saver(mongodb_uri: str, db_name: str) -> Iterator[Any]:
    """Factory of `MongoSaver`s on one fresh database; each owns a client closed at the end."""
    from mongo_saver import MongoSaver

    clients: list[MongoClient[Any]] = []

    def make(**options: Any) -> MongoSaver:
        client: MongoClient[Any] = MongoClient(mongodb_uri)
        clients.append(client)
        saver = MongoSaver(client, db_name=db_name, **options)
        saver.setup()
        return saver

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def saver(make_sync_saver: Any) -> Any:
    return make_sync_saver()


def async_client_for(kind: str, uri: str) -> Any:
    """pymongo's native async client, or Motor's, on `uri`."""
    if kind == "motor":
        from motor.motor_asyncio import AsyncIOMotorClient

        return AsyncIOMotorClient(uri)
    from pymongo import AsyncMongoClient

    return AsyncMongoClient(uri)


async def close_async_client(client: Any) -> None:
    result = client.close()
    if hasattr(result, "__await__"):
        await result


@pytest.fixture(params=["pymongo-async", "motor"])
async def async_saver(request: pytest.FixtureRequest, mongodb_uri: str, db_name: str) -> Any:
    from mongo_saver import AsyncMongoSaver

    client = async_client_for(request.param, mongodb_uri)
    saver = AsyncMongoSaver(client, db_name=db_name)
    await saver.setup()
    yield saver
    await close_async_client(client)
