"""Per-thread leases in MongoDB: two runs on one thread queue instead of racing.

A lease is one small document per thread in the `thread_leases` collection::

    {_id: thread_id, holder: "host:pid:random" | None, token: int,
     expires_at: date, acquired_at: date}

* **Acquire** is one atomic `find_one_and_update` with upsert on `{_id: thread_id}` whose
  filter only matches a free lease, an expired one, or our own: the update sets the
  holder and increments `token`. If another holder has it, the upsert collides with the
  existing `_id` and nothing changes; the caller waits (backoff with jitter) until the
  lease frees or expires, or until its `timeout`.
* **Fencing token**: `token` grows by one at every acquisition of a thread's lease, so a
  later holder always has a larger token than any earlier one.
* **Renewal** runs in the background (a thread for the blocking saver, a task for the
  asyncio one) every `ttl / 3` and only succeeds while the stored holder and token are
  still ours. A renewal that matches nothing means the lease was taken over: the lease
  is marked lost.
* **Fencing on write**: `check()` raises `LeaseError` when the lease is lost or its local
  deadline (the start of the last successful acquire or renewal, plus `ttl`, on this
  process's monotonic clock, so always before the stored expiry) has passed. While a
  lease is active, the saver runs `check()` before every `put` and `put_writes` for that
  thread, so a holder that lost its lease cannot write.

Expiry times are written and compared with the clients' clocks: hosts sharing a thread
must keep their clocks in sync (NTP) to well under `ttl`. Test servers disagree on date
comparisons against `$$NOW`, so the server's clock is not used.

The plans here are shared by both savers; `Lease` and `AsyncLease` only add the context
manager and the background renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as dt
import logging
import os
import random
import socket
import threading
import time
import uuid
from types import TracebackType
from typing import TYPE_CHECKING, Any

from pymongo.errors import PyMongoError

from mongo_saver.documents import require_id, utcnow
from mongo_saver.errors import LeaseError
from mongo_saver.ops import FindOneAndUpdate, Plan, Sleep, UpdateOne_

if TYPE_CHECKING:
    from mongo_saver.runners import AsyncRunner, SyncRunner

logger = logging.getLogger("mongo_saver.lease")

LEASE_COLLECTION = "thread_leases"
DEFAULT_TTL = 30.0
_FIRST_WAIT = 0.05
_MAX_WAIT = 1.0

_Entered = tuple[tuple[str, str, "LeaseState"], ...]
_CURRENT: contextvars.ContextVar[_Entered] = contextvars.ContextVar(
    "mongo_saver_current_leases", default=()
)
"""The leases entered in this context, as (saver key, thread_id, lease), innermost last."""


def _holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class LeaseState:
    """One lease's identity, token and deadline, and the plans that change them."""

    def __init__(
        self,
        collection: str,
        thread_id: str,
        *,
        ttl: float = DEFAULT_TTL,
        timeout: float | None = None,
    ) -> None:
        require_id("thread_id", thread_id)
        if not isinstance(ttl, (int, float)) or isinstance(ttl, bool) or ttl <= 0:
            raise LeaseError(f"lease ttl must be a positive number of seconds, got {ttl!r}")
        if timeout is not None and (isinstance(timeout, bool) or timeout < 0):
            raise LeaseError(f"lease timeout must be None or >= 0 seconds, got {timeout!r}")
        self.collection = collection
        self.thread_id = thread_id
        self.ttl = float(ttl)
        self.timeout = timeout
        self.renew_interval = self.ttl / 3
        """Seconds between background renewals."""
        self.holder = _holder_id()
        self.token: int | None = None
        self._deadline = 0.0
        self._lost: str | None = None
        self._released = False
        self._lock = threading.Lock()

    # --- state ---------------------------------------------------------------------------

    @property
    def lost(self) -> bool:
        """True once the lease was taken over, expired locally, or failed to renew."""
        with self._lock:
            return self._lost is not None or (
                self.token is not None and time.monotonic() >= self._deadline
            )

    def check(self) -> int:
        """Return the fencing token if the lease is still ours, else raise `LeaseError`."""
        with self._lock:
            where = f"lease on thread {self.thread_id!r}"
            if self.token is None:
                raise LeaseError(f"{where} is not held")
            if self._released:
                raise LeaseError(f"{where} (token {self.token}) was released")
            if self._lost is not None:
                raise LeaseError(f"{where} (token {self.token}) was lost: {self._lost}")
            overdue = time.monotonic() - self._deadline
            if overdue >= 0:
                raise LeaseError(
                    f"{where} (token {self.token}) expired {overdue:.3f}s ago without a "
                    f"successful renewal (ttl {self.ttl}s); another run may hold it now"
                )
            return self.token

    def mark_lost(self, reason: str) -> None:
        with self._lock:
            if self._lost is None:
                self._lost = reason

    # --- plans ---------------------------------------------------------------------------

    def _expiry(self) -> dt.datetime:
        return utcnow() + dt.timedelta(seconds=self.ttl)

    def try_acquire(self) -> Plan[bool]:
        """One atomic attempt; True if the lease is now ours."""
        started = time.monotonic()
        now = utcnow()
        doc = yield FindOneAndUpdate(
            self.collection,
            {"_id": self.thread_id,
             "$or": [{"holder": None}, {"holder": self.holder},
                     {"expires_at": {"$lte": now}}]},
            {"$set": {"holder": self.holder, "acquired_at": now, "expires_at": self._expiry()},
             "$inc": {"token": 1}},
            upsert=True,
        )
        if doc is None or doc.get("holder") != self.holder:
            return False
        with self._lock:
            self.token = int(doc["token"])
            self._deadline = started + self.ttl
            self._lost = None
            self._released = False
        return True

    def acquire(self) -> Plan[int]:
        """Wait for the lease (backoff with jitter) until `timeout`; return the token."""
        give_up = None if self.timeout is None else time.monotonic() + self.timeout
        wait = _FIRST_WAIT
        cap = max(_FIRST_WAIT, min(_MAX_WAIT, self.ttl / 4))
        while True:
            if (yield from self.try_acquire()):
                assert self.token is not None
                return self.token
            pause = wait * (0.5 + random.random())
            if give_up is not None:
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    raise LeaseError(
                        f"thread {self.thread_id!r} is leased by another run; "
                        f"gave up after {self.timeout}s"
                    )
                pause = min(pause, remaining)
            yield Sleep(pause)
            wait = min(wait * 2, cap)

    def renew(self) -> Plan[bool]:
        """Extend the lease if it is still ours; on a takeover mark it lost."""
        started = time.monotonic()
        matched = yield UpdateOne_(
            self.collection,
            {"_id": self.thread_id, "holder": self.holder, "token": self.token},
            {"$set": {"expires_at": self._expiry()}},
        )
        if not matched:
            self.mark_lost("a renewal found another holder (or no lease) in the database")
            return False
        with self._lock:
            self._deadline = max(self._deadline, started + self.ttl)
        return True

    def release(self) -> Plan[None]:
        """Free the lease if it is still ours; the token stays for the next holder."""
        with self._lock:
            self._released = True
        if self.token is None:
            return
        yield UpdateOne_(
            self.collection,
            {"_id": self.thread_id, "holder": self.holder, "token": self.token},
            {"$set": {"holder": None, "expires_at": utcnow()}},
        )


# --- the saver side: which leases guard which writes -------------------------------------


class LeaseRegistry:
    """The leases a saver's process holds, consulted before every checkpoint write."""

    def __init__(self) -> None:
        self.key = uuid.uuid4().hex
        self._by_thread: dict[str, list[LeaseState]] = {}
        self._lock = threading.Lock()

    def enter(self, lease: LeaseState) -> contextvars.Token[_Entered]:
        with self._lock:
            self._by_thread.setdefault(lease.thread_id, []).append(lease)
        return _CURRENT.set((*_CURRENT.get(), (self.key, lease.thread_id, lease)))

    def exit(
        self, lease: LeaseState, token: contextvars.Token[_Entered]
    ) -> None:
        with self._lock:
            held = self._by_thread.get(lease.thread_id, [])
            if lease in held:
                held.remove(lease)
            if not held:
                self._by_thread.pop(lease.thread_id, None)
        with contextlib.suppress(ValueError):  # exited in another context: nothing to undo
            _CURRENT.reset(token)

    def guard(self, config: Any) -> None:
        """Raise `LeaseError` if a write to this config's thread must not happen.

        The lease entered in the caller's context decides; without one, every lease this
        process holds on the thread must still be valid. No lease: nothing to check.
        """
        if not self._by_thread:
            return
        configurable = (config or {}).get("configurable") or {}
        thread_id = configurable.get("thread_id")
        if not isinstance(thread_id, str):
            return  # the core rejects it with a clear error
        mine = [lease for key, thread, lease in _CURRENT.get()
                if key == self.key and thread == thread_id]
        if mine:
            mine[-1].check()
            return
        with self._lock:
            held = list(self._by_thread.get(thread_id, ()))
        for lease in held:
            lease.check()


# --- context managers --------------------------------------------------------------------


class _LeaseBase:
    def __init__(self, state: LeaseState, registry: LeaseRegistry) -> None:
        self.state = state
        self._registry = registry
        self._context: contextvars.Token[_Entered] | None = None

    @property
    def thread_id(self) -> str:
        return self.state.thread_id

    @property
    def token(self) -> int:
        """The fencing token: larger for every later holder of this thread's lease."""
        if self.state.token is None:
            raise LeaseError(f"lease on thread {self.state.thread_id!r} is not held")
        return self.state.token

    @property
    def lost(self) -> bool:
        return self.state.lost

    def check(self) -> int:
        """Raise `LeaseError` unless the lease is still held; return the token."""
        return self.state.check()

    def _note_exit(self) -> None:
        if self.state.lost:
            logger.warning(
                "lease on thread %r (token %s) was lost while held; writes after the loss "
                "were refused", self.state.thread_id, self.state.token,
            )


class Lease(_LeaseBase):
    """`with saver.lease(thread_id):` for the blocking `MongoSaver`."""

    def __init__(self, state: LeaseState, registry: LeaseRegistry, runner: SyncRunner) -> None:
        super().__init__(state, registry)
        self._runner = runner
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def __enter__(self) -> Lease:
        self._runner.run(self.state.acquire())
        self._context = self._registry.enter(self.state)
        self._stop.clear()
        self._renewer = threading.Thread(
            target=self._renew_loop, name=f"mongo-saver-lease-{self.thread_id}", daemon=True
        )
        self._renewer.start()
        return self

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.state.renew_interval):
            try:
                if not self._runner.run(self.state.renew()):
                    logger.warning("lease on thread %r was taken over", self.thread_id)
                    return
            except PyMongoError as exc:  # keep trying; the local deadline fences writes
                logger.warning("renewing lease on thread %r failed: %s", self.thread_id,
                               type(exc).__name__)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=self.state.ttl)
        if self._context is not None:
            self._registry.exit(self.state, self._context)
            self._context = None
        self._note_exit()
        try:
            self._runner.run(self.state.release())
        except PyMongoError as error:  # it expires by itself
            logger.warning("releasing lease on thread %r failed: %s", self.thread_id,
                           type(error).__name__)


class AsyncLease(_LeaseBase):
    """`async with saver.lease(thread_id):` for `AsyncMongoSaver`."""

    def __init__(self, state: LeaseState, registry: LeaseRegistry, runner: AsyncRunner) -> None:
        super().__init__(state, registry)
        self._runner = runner
        self._stop: asyncio.Event | None = None
        self._renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncLease:
        await self._runner.run(self.state.acquire())
        self._context = self._registry.enter(self.state)
        self._stop = asyncio.Event()
        self._renewer = asyncio.create_task(self._renew_loop(self._stop))
        return self

    async def _renew_loop(self, stop: asyncio.Event) -> None:
        while True:
            try:
                await asyncio.wait_for(stop.wait(), self.state.renew_interval)
                return
            except TimeoutError:
                pass
            try:
                if not await self._runner.run(self.state.renew()):
                    logger.warning("lease on thread %r was taken over", self.thread_id)
                    return
            except PyMongoError as exc:
                logger.warning("renewing lease on thread %r failed: %s", self.thread_id,
                               type(exc).__name__)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._renewer is not None:
            try:
                await asyncio.wait_for(self._renewer, self.state.ttl)
            except TimeoutError:
                self._renewer.cancel()
        if self._context is not None:
            self._registry.exit(self.state, self._context)
            self._context = None
        self._note_exit()
        try:
            await self._runner.run(self.state.release())
        except PyMongoError as error:
            logger.warning("releasing lease on thread %r failed: %s", self.thread_id,
                           type(error).__name__)
