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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.base import ChannelVersions
from langgraph.checkpoint.serde.base import SerializerProtocol

from mongo_saver.documents import blob_key, dump_typed, load_typed, require_name
from mongo_saver.errors import CorruptDocumentError

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
    stale: bool = False
    """The stored chain cannot be lifted to the current schema (a raw migration step lies
    between): the next checkpoint stores this channel in full."""
    scalar: Any = ...
    """The value itself when it is immutable (str, number, bool, bytes, None); `...` else."""

    def known_value(self) -> Any:
        """The decoded value this process holds for `key`, or `UNKNOWN`."""
        if self.stale:
            return UNKNOWN
        if self.items is not None:
            return list(self.items)
        return self.scalar if self.scalar is not ... else UNKNOWN


class _Unknown:
    pass


UNKNOWN: Any = _Unknown()
_IMMUTABLE = (str, int, float, bool, bytes, type(None))


def _immutable(value: Any) -> bool:
    return isinstance(value, _IMMUTABLE)


ChannelState = dict[str, StoredChannel]
Lift = Callable[[str, Any, int, int], tuple[str, Any]]
"""`lift(channel, value, from_schema, to_schema)`: a stored value and its channel's name,
migrated."""


def known_values(state: ChannelState) -> tuple[dict[str, StoredChannel], list[str]]:
    """Channels whose decoded value this process holds, by head key, and every key
    they make unnecessary to fetch."""
    # Only our own string versions are unique per write; integer versions may be reused.
    known = {
        s.key: s
        for s in state.values()
        if isinstance(s.version, str) and s.known_value() is not UNKNOWN
    }
    return known, sorted({k for s in known.values() for k in s.chain})


class StateCache:
    """Bounded LRU of the channel state of recently written or read checkpoints."""

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._entries: OrderedDict[tuple[str, str, str], ChannelState] = OrderedDict()
        self._latest: OrderedDict[tuple[str, str], ChannelState] = OrderedDict()
        self._lock = threading.Lock()

    def latest(self, thread_id: str, checkpoint_ns: str) -> ChannelState:
        """The state this process last wrote or read in a thread namespace (or empty)."""
        with self._lock:
            return self._latest.get((thread_id, checkpoint_ns), {})

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
            scope = key[:2]
            self._latest[scope] = state
            self._latest.move_to_end(scope)
            while len(self._latest) > self._max:
                self._latest.popitem(last=False)

    def discard_thread(self, thread_id: str) -> None:
        with self._lock:
            for key in [k for k in self._entries if k[0] == thread_id]:
                del self._entries[key]
            for scope in [k for k in self._latest if k[0] == thread_id]:
                del self._latest[scope]


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
    schema_version: int,
) -> tuple[list[dict[str, Any]], list[str], dict[str, str], ChannelState]:
    """Value entries to store, keys needed to read back, head keys that differ from the
    default, and the new channel state."""
    entries: list[dict[str, Any]] = []
    state: ChannelState = {}
    parent = parent or {}
    for channel, version in channel_versions.items():
        require_name("channel", channel)
        previous = parent.get(channel)
        what = f"channel {channel!r} of thread {thread_id!r}"
        if channel not in new_versions:
            if previous is None or previous.version != version:
                key = blob_key(channel, version)
                state[channel] = StoredChannel(version, key, (key,))
            elif previous.stale and channel in channel_values:
                key = f"{blob_key(channel, version)}@{schema_version}"
                entry, state[channel] = _full_entry(
                    serde, channel, version, key, channel_values[channel], what, schema_version
                )
                entries.append(entry)
            else:
                state[channel] = previous
            continue
        version = new_versions[channel]
        key = blob_key(channel, version)
        if channel not in channel_values:
            entries.append({"k": key, "c": channel, "v": version, "sv": schema_version,
                            "kind": "empty"})
            state[channel] = StoredChannel(version, key, (key,))
            continue
        value = channel_values[channel]
        if (
            isinstance(value, list)
            and previous is not None
            and previous.items is not None
            and not previous.stale
            and previous.depth < full_copy_every
            and _extends(previous.items, value)
        ):
            payload = dump_typed(serde, value[len(previous.items) :], what)
            appended = previous.appended_bytes + len(payload["d"])
            if appended <= max(previous.base_bytes, 4096):
                entries.append({"k": key, "c": channel, "v": version, "sv": schema_version,
                                "kind": "append", "prev": previous.key,
                                "depth": previous.depth + 1, **payload})
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
        entry, state[channel] = _full_entry(
            serde, channel, version, key, value, what, schema_version
        )
        entries.append(entry)
    blob_keys = sorted({k for stored in state.values() for k in stored.chain})
    heads = {
        ch: stored.key
        for ch, stored in state.items()
        if stored.key != blob_key(ch, stored.version)
    }
    return entries, blob_keys, heads, state


def _full_entry(
    serde: SerializerProtocol,
    channel: str,
    version: str | int | float,
    key: str,
    value: Any,
    what: str,
    schema_version: int,
) -> tuple[dict[str, Any], StoredChannel]:
    payload = dump_typed(serde, value, what)
    entry = {"k": key, "c": channel, "v": version, "sv": schema_version, "kind": "full",
             "depth": 0, **payload}
    stored = StoredChannel(
        version,
        key,
        (key,),
        0,
        tuple(value) if isinstance(value, list) else None,
        len(payload["d"]),
        0,
        scalar=value if _immutable(value) else ...,
    )
    return entry, stored


class MissingBlobs(Exception):
    """Raised by `resolve_values` when entries needed to rebuild a value were not fetched."""

    def __init__(self, keys: set[str]) -> None:
        super().__init__(f"{len(keys)} value entries not fetched")
        self.keys = keys


def resolve_values(
    serde: SerializerProtocol,
    channel_versions: ChannelVersions,
    heads: Mapping[str, str],
    entries: Mapping[str, Mapping[str, Any]],
    *,
    schema_version: int,
    lift: Lift,
    absent: Iterable[str] = (),
    known: Mapping[str, StoredChannel] | None = None,
) -> tuple[dict[str, Any], ChannelState]:
    """Rebuild channel values at `schema_version` from fetched entries.

    Each entry is stored at the schema version of the code that wrote it; an append
    written after a migration extends its base lifted to the append's version, so a
    value is lifted step by step and never twice. `known` holds values this process
    already decoded (at the current schema) by key: a chain stops there, so a growing
    list costs only its new items. `absent` lists keys known not to exist: like
    LangGraph's own savers, a channel whose version has no stored value is left out.
    Raises `MissingBlobs` with the keys still to fetch.
    """
    absent_keys = set(absent)
    known = known or {}
    values: dict[str, Any] = {}
    state: ChannelState = {}
    missing: set[str] = set()
    for channel, version in channel_versions.items():
        key = heads.get(channel) or blob_key(channel, version)
        links: list[Mapping[str, Any]] = []  # newest first
        cursor: str | None = key
        while cursor is not None and cursor not in known:
            entry = entries.get(cursor)
            if entry is None:
                if cursor not in absent_keys:
                    missing.add(cursor)
                elif links:
                    raise CorruptDocumentError(
                        f"channel {channel!r} at version {version!r}: stored value "
                        f"{cursor!r} of its append chain is missing"
                    )
                break
            links.append(entry)
            cursor = entry.get("prev") if entry.get("kind") == "append" else None
        if cursor is not None and cursor not in known:
            continue  # incomplete chain: fetched later, or absent
        links.reverse()
        if links and links[0].get("kind") == "empty":
            state[channel] = StoredChannel(version, key, (key,))
            continue
        what = f"channel {channel!r} at version {version!r}"
        if cursor is not None:  # the chain reached a value this process holds
            held = known[cursor]
            value, at, name = held.known_value(), schema_version, channel
            chain_keys: tuple[str, ...] = held.chain
            base_bytes, appended_bytes = held.base_bytes, held.appended_bytes
        else:
            base, links = links[0], links[1:]
            value = load_typed(serde, base, what)
            at, name = base.get("sv", schema_version), base["c"]
            chain_keys = (base["k"],)
            base_bytes, appended_bytes = len(base["d"]), 0
        if links and not isinstance(value, list):
            raise CorruptDocumentError(
                f"{what}: an append chain starts from a {type(value).__name__}, not a list"
            )
        for link in links:
            link_sv = link.get("sv", at)
            if link_sv > at:
                (name, value), at = lift(name, value, at, link_sv), link_sv
            value = [*value, *load_typed(serde, link, what)]
            appended_bytes += len(link["d"])
            chain_keys += (link["k"],)
        if at < schema_version:
            name, value = lift(name, value, at, schema_version)
        values[channel] = value
        state[channel] = StoredChannel(
            version,
            key,
            chain_keys,
            len(chain_keys) - 1,
            tuple(value) if isinstance(value, list) else None,
            base_bytes,
            appended_bytes,
            scalar=value if _immutable(value) else ...,
        )
    if missing:
        raise MissingBlobs(missing)
    return values, state
