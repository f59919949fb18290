"""Count database round trips and wire bytes with pymongo command monitoring.

Pass a :class:`CommandCounter` to a client (``MongoClient(uri, event_listeners=[counter])``,
``AsyncMongoClient`` or Motor alike) and take :meth:`CommandCounter.snapshot` before and
after the operation being measured; the difference is a :class:`Usage`.

A round trip is one ``CommandStartedEvent``, except the connection-management commands
listed in :data:`IGNORED_COMMANDS` (handshakes, pings, session cleanup), which a saver does
not choose to send. Bytes sent and received are the BSON sizes of the commands and of the
replies, which tracks what crosses the wire closely (the wire framing is a few bytes per
message and is not counted).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import bson
from pymongo import monitoring

IGNORED_COMMANDS = frozenset(
    {"hello", "ismaster", "isMaster", "ping", "endSessions", "saslStart", "saslContinue"}
)

__all__ = ["IGNORED_COMMANDS", "CommandCounter", "Usage", "measure"]


@dataclass(frozen=True, slots=True)
class Usage:
    """What one or more operations cost on the wire (and, with :func:`measure`, locally)."""

    round_trips: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    failures: int = 0
    commands: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0
    wall_s: float = 0.0

    def __sub__(self, other: Usage) -> Usage:
        names = set(self.commands) | set(other.commands)
        diff = {n: self.commands.get(n, 0) - other.commands.get(n, 0) for n in names}
        return Usage(
            round_trips=self.round_trips - other.round_trips,
            bytes_sent=self.bytes_sent - other.bytes_sent,
            bytes_received=self.bytes_received - other.bytes_received,
            failures=self.failures - other.failures,
            commands={n: c for n, c in sorted(diff.items()) if c},
            cpu_s=self.cpu_s - other.cpu_s,
            wall_s=self.wall_s - other.wall_s,
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "round_trips": self.round_trips,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "failures": self.failures,
            "commands": dict(self.commands),
            "cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
        }


class CommandCounter(monitoring.CommandListener):
    """A thread-safe pymongo command listener keeping running totals.

    One counter per client: it sees every command that client sends, from any thread or
    event loop. Totals only grow; measure by differences of :meth:`snapshot`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._round_trips = 0
        self._bytes_sent = 0
        self._bytes_received = 0
        self._failures = 0
        self._commands: Counter[str] = Counter()
        self._counted: set[tuple[object, int]] = set()
        self.enabled = True

    # -- pymongo.monitoring.CommandListener ------------------------------------------------

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if not self.enabled or event.command_name in IGNORED_COMMANDS:
            return
        size = len(bson.encode(event.command))
        with self._lock:
            self._round_trips += 1
            self._bytes_sent += size
            self._commands[event.command_name] += 1
            self._counted.add((event.connection_id, event.request_id))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        key = (event.connection_id, event.request_id)
        with self._lock:
            if key not in self._counted:
                return
            self._counted.discard(key)
        size = len(bson.encode(event.reply))
        with self._lock:
            self._bytes_received += size

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        key = (event.connection_id, event.request_id)
        with self._lock:
            if key not in self._counted:
                return
            self._counted.discard(key)
            self._failures += 1

    # -- reading ------------------------------------------------------------------------

    def snapshot(self) -> Usage:
        with self._lock:
            return Usage(
                round_trips=self._round_trips,
                bytes_sent=self._bytes_sent,
                bytes_received=self._bytes_received,
                failures=self._failures,
                commands=dict(self._commands),
            )

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Stop counting inside the block (for the benchmark's own bookkeeping queries)."""
        previous, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = previous


class _Measurement:
    def __init__(self) -> None:
        self.usage = Usage()


@contextmanager
def measure(counter: CommandCounter | None) -> Iterator[_Measurement]:
    """Measure round trips, bytes, client CPU (``time.process_time``) and wall time.

    ``counter`` may be None for a saver with no database (the wire numbers stay 0).
    """
    result = _Measurement()
    before = counter.snapshot() if counter is not None else Usage()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        yield result
    finally:
        cpu1, wall1 = time.process_time(), time.perf_counter()
        after = counter.snapshot() if counter is not None else Usage()
        wire = after - before
        result.usage = Usage(
            round_trips=wire.round_trips,
            bytes_sent=wire.bytes_sent,
            bytes_received=wire.bytes_received,
            failures=wire.failures,
            commands=wire.commands,
            cpu_s=cpu1 - cpu0,
            wall_s=wall1 - wall0,
        )
