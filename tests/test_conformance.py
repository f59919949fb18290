"""LangGraph's conformance suite, every capability, for each client the savers accept.

`MongoSaver` is blocking, so it is held to the same (async) tests through an adapter
whose async methods call the sync ones.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from pymongo import MongoClient

from mongo_saver import AsyncMongoSaver, MongoSaver
from tests.conftest import SAVER_KINDS, async_client_for, close_async_client

CAPABILITIES = [
    "put",
    "put_writes",
    "get_tuple",
    "list",
    "delete_thread",
    "delete_for_runs",
    "copy_thread",
    "prune",
]


class SyncAsAsync(BaseCheckpointSaver[str]):
    """Presents a blocking saver through the async API the conformance suite calls."""

    def __init__(self, inner: MongoSaver) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner

    async def aget_tuple(self, config: Any) -> Any:
        return self.inner.get_tuple(config)

    async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[Any]:
        for item in self.inner.list(config, **kwargs):
            yield item

    async def aput(self, *args: Any) -> Any:
        return self.inner.put(*args)

    async def aput_writes(self, *args: Any, **kwargs: Any) -> None:
        self.inner.put_writes(*args, **kwargs)

    async def adelete_thread(self, thread_id: str) -> None:
        self.inner.delete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Any) -> None:
        self.inner.delete_for_runs(run_ids)

    async def acopy_thread(self, source: str, target: str) -> None:
        self.inner.copy_thread(source, target)

    async def aprune(self, thread_ids: Any, *, strategy: str = "keep_latest") -> None:
        self.inner.prune(thread_ids, strategy=strategy)

    def get_next_version(self, current: Any, channel: None = None) -> str:
        return self.inner.get_next_version(current)


@pytest.fixture(scope="module")
def reports() -> Iterator[dict[str, Any]]:
    yield {}


@pytest.mark.parametrize("kind", SAVER_KINDS)
async def test_every_capability_passes(kind: str, mongodb_uri: str) -> None:
    db = f"conf_{uuid.uuid4().hex[:10]}"

    @checkpointer_test(name=f"mongo-saver[{kind}]")
    async def factory() -> AsyncIterator[BaseCheckpointSaver[str]]:
        if kind == "sync":
            client: Any = MongoClient(mongodb_uri)
            saver: BaseCheckpointSaver[str] = SyncAsAsync(MongoSaver(client, db_name=db))
            saver.inner.setup()  # type: ignore[attr-defined]
            yield saver
            client.close()
            return
        client = async_client_for(kind, mongodb_uri)
        async_saver = AsyncMongoSaver(client, db_name=db)
        await async_saver.setup()
        yield async_saver
        await close_async_client(client)

    report = await validate(factory)
    summary = {
        cap: (result.passed, result.tests_passed, result.tests_failed, result.failures)
        for cap, result in report.results.items()
    }
    for cap in CAPABILITIES:
        passed, n_passed, n_failed, failures = summary[cap]
        assert passed is True, f"{cap}: {n_failed} failed: {failures}"
        assert n_passed > 0
