"""Channel values stored once per version, with appends stored as appends.

A checkpoint document carries value entries only for the channels in `new_versions`.
A list channel that grew by appending (the usual `messages` with `add_messages`, or any
`operator.add` list) is stored as just the appended items plus the key of the previous
version; a full copy is written when the chain reaches `full_copy_every` links or the
appended bytes outgrow the last full copy, so a read never walks far and storage grows
with what a thread added, not with its length squared. An edited list (a removed or
replaced item) is always stored in full.

Value entry::

    {k: key, c: channel, v: version, kind: "full" | "append" | "empty",
     t: serializer type, d: bytes, prev: key (append only), depth: int}

Append detection compares items by identity first, then equality, against a snapshot
taken when the previous version was written or read by this process. That snapshot
lives in a small per-saver LRU cache; a cache miss only costs a full copy, never
correctness. LangGraph's rule that nodes return updates instead of mutating state in
place is what makes the identity shortcut sound.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.base import ChannelVersions
from langgraph.checkpoint.serde.base import SerializerProtocol

from mongo_saver.documents import blob_key, dump_typed, load_typed, require_name

DEFAULT_FULL_COPY_EVERY = 64


@dataclass(frozen=True, slots=True)
class StoredChannel:
    """What this process knows about one stored channel version."""

    version: str | int | float
    key: str
    chain: tuple[str, ...]
    """Keys needed to rebuild the value, base first; just `(key,)` when unknown."""
    depth: int = 0
    items: tuple[Any, ...] | None = None
    """Snapshot of a list value's items, for append detection; None for other values."""
    base_bytes: int = 0
    appended_bytes: int = 0


ChannelState = dict[str, StoredChannel]


class StateCache:
    """Bounded LRU of the channel state of recently written or read checkpoints."""

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._entries: OrderedDict[tuple[str, str, str], ChannelState] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str]) -> ChannelState | None:
        with self._lock:
            state = self._entries.get(key)
            if state is not None:
                self._entries.move_to_end(key)
            return state

    def put(self, key: tuple[str, str, str], state: ChannelState) -> None:
        if self._max <= 0:
            return
        with self._lock:
            self._entries[key] = state
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def discard_thread(self, thread_id: str) -> None:
        with self._lock:
            for key in [k for k in self._entries if k[0] == thread_id]:
                del self._entries[key]


def _extends(old: tuple[Any, ...], new: list[Any]) -> bool:
    if len(new) <= len(old):
        return False
    return all(a is b or a == b for a, b in zip(old, new, strict=False))


def plan_values(
    serde: SerializerProtocol,
    *,
    thread_id: str,
    channel_values: Mapping[str, Any],
    channel_versions: ChannelVersions,
    new_versions: ChannelVersions,
    parent: ChannelState | None,
    full_copy_every: int,
) -> tuple[list[dict[str, Any]], list[str], ChannelState]:
    """Value entries to store, blob keys needed to read back, and the new channel state."""
    entries: list[dict[str, Any]] = []
    state: ChannelState = {}
    parent = parent or {}
    for channel, version in channel_versions.items():
        require_name("channel", channel)
        previous = parent.get(channel)
        if channel not in new_versions:
            if previous is not None and previous.version == version:
                state[channel] = previous
            else:
                key = blob_key(channel, version)
                state[channel] = StoredChannel(version, key, (key,))
            continue
        version = new_versions[channel]
        key = blob_key(channel, version)
        entry: dict[str, Any] = {"k": key, "c": channel, "v": version}
        if channel not in channel_values:
            entry["kind"] = "empty"
            state[channel] = StoredChannel(version, key, (key,))
            entries.append(entry)
            continue
        value = channel_values[channel]
        what = f"channel {channel!r} of thread {thread_id!r}"
        if (
            isinstance(value, list)
            and previous is not None
            and previous.items is not None
            and previous.depth < full_copy_every
            and _extends(previous.items, value)
        ):
            payload = dump_typed(serde, value[len(previous.items) :], what)
            appended = previous.appended_bytes + len(payload["d"])
            if appended <= max(previous.base_bytes, 4096):
                entry.update(kind="append", prev=previous.key, depth=previous.depth + 1, **payload)
                entries.append(entry)
                state[channel] = StoredChannel(
                    version,
                    key,
                    (*previous.chain, key),
                    previous.depth + 1,
                    tuple(value),
                    previous.base_bytes,
                    appended,
                )
                continue
        payload = dump_typed(serde, value, what)
        entry.update(kind="full", depth=0, **payload)
        entries.append(entry)
        state[channel] = StoredChannel(
            version,
            key,
            (key,),
            0,
            tuple(value) if isinstance(value, list) else None,
            len(payload["d"]),
            0,
        )
    blob_keys = sorted({k for stored in state.values() for k in stored.chain})
    return entries, blob_keys, state


class MissingBlobs(Exception):
    """Raised by `resolve_values` when entries needed to rebuild a value were not fetched."""

    def __init__(self, keys: set[str]) -> None:
        super().__init__(f"{len(keys)} value entries not fetched")
        self.keys = keys


def resolve_values(
    serde: SerializerProtocol,
    channel_versions: ChannelVersions,
    entries: Mapping[str, Mapping[str, Any]],
    absent: Iterable[str] = (),
) -> tuple[dict[str, Any], ChannelState]:
    """Rebuild channel values from fetched entries.

    `absent` lists keys known not to exist anywhere: like LangGraph's own savers, a
    channel whose version has no stored value is left out of `channel_values`.
    Raises `MissingBlobs` with the keys still to fetch.
    """
    absent_keys = set(absent)
    values: dict[str, Any] = {}
    state: ChannelState = {}
    missing: set[str] = set()
    for channel, version in channel_versions.items():
        key = blob_key(channel, version)
        chain: list[Mapping[str, Any]] = []
        cursor: str | None = key
        while cursor is not None:
            entry = entries.get(cursor)
            if entry is None:
                if cursor not in absent_keys:
                    missing.add(cursor)
                break
            chain.append(entry)
            cursor = entry.get("prev") if entry.get("kind") == "append" else None
        if cursor is not None:  # incomplete chain: fetched later, or absent
            continue
        chain.reverse()
        base = chain[0]
        if base.get("kind") == "empty":
            state[channel] = StoredChannel(version, key, (key,))
            continue
        what = f"channel {channel!r} at version {version!r}"
        value = load_typed(serde, base, what)
        base_bytes = len(base["d"])
        appended_bytes = 0
        for link in chain[1:]:
            value = [*value, *load_typed(serde, link, what)]
            appended_bytes += len(link["d"])
        values[channel] = value
        state[channel] = StoredChannel(
            version,
            key,
            tuple(e["k"] for e in chain),
            len(chain) - 1,
            tuple(value) if isinstance(value, list) else None,
            base_bytes,
            appended_bytes,
        )
    if missing:
        raise MissingBlobs(missing)
    return values, state
