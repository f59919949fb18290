"""Channel values stored once per version, with appends stored as appends.

A checkpoint document carries value entries only for the channels in `new_versions`.
A list channel that grew by appending (the usual `messages` with `add_messages`, any
`operator.add` list, or the `_DeltaSnapshot` a `DeltaChannel` writes now and then) is
stored as just the appended items plus the key of the value it extends. Appends merge
log-structurally (see `append_level`), so a read follows a bounded number of links, the
bytes a turn writes stay flat and storage grows with what a thread added, not with its
length squared. An edited list (a removed or replaced item) is always stored in full.

Value entry (inside the checkpoint document that introduced the version)::

    {k: key, c: channel, sv: schema version, kind: "full" | "append",
     t: serializer type, d: bytes, h: CRC-32, prev: key (append), l: merge level (append,
     when not 0), w: 1 (a _DeltaSnapshot)}

A channel whose current version has no stored value (a consumed trigger, a
`DeltaChannel` between snapshots) is only named in the document's `empty` list.

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
from dataclasses import dataclass, replace
from typing import Any

from langgraph.checkpoint.base import ChannelVersions
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from mongo_saver.documents import blob_key, dump_typed, load_typed, require_name
from mongo_saver.errors import CorruptDocumentError

DEFAULT_MERGE_EVERY = 16
FULL = 99
"""The level of a full copy: never merged into."""
MAX_LEVEL = 3
"""Past this merge level a full copy is written (every 16**4 = 65,536 appends by default)."""


class _Unknown:
    pass


UNKNOWN: Any = _Unknown()
IMMUTABLE_TYPES = (str, int, float, bool, bytes, type(None))


@dataclass(frozen=True, slots=True)
class StoredChannel:
    """What this process knows about one stored channel version."""

    version: str | int | float
    key: str
    chain: tuple[str, ...]
    """Keys needed to rebuild the value, base first; just `(key,)` when unknown."""
    levels: tuple[int, ...] = ()
    """The merge level of each `chain` entry (see `append_level`); `FULL` for the base."""
    lengths: tuple[int, ...] = ()
    """The list's length once each `chain` entry is applied."""
    items: tuple[Any, ...] | None = None
    """The items of a list value (or of a `_DeltaSnapshot`'s list), for append detection."""
    stale: bool = False
    """The stored chain cannot be lifted to the current schema (a raw migration step lies
    between): the next checkpoint stores this channel in full."""
    scalar: Any = UNKNOWN
    """The value itself when it is immutable (str, number, bool, bytes, None)."""
    snapshot: bool = False
    """The value is a `_DeltaSnapshot` wrapping `items`."""
    empty: bool = False
    """This version has no stored value."""
    carried: StoredChannel | None = None
    """For an empty version: the last stored value before it (a later snapshot may extend it)."""
    known: bool = True
    """False when this process only knows the version's key, not whether it holds a value."""

    def known_value(self) -> Any:
        """The decoded value this process holds for `key`, or `UNKNOWN`."""
        if self.stale or self.empty:
            return UNKNOWN
        if self.items is not None:
            return _DeltaSnapshot(list(self.items)) if self.snapshot else list(self.items)
        return self.scalar

    def last_value(self) -> StoredChannel | None:
        return self.carried if self.empty else self


ChannelState = dict[str, StoredChannel]
Lift = Callable[[str, Any, int, int], tuple[str, Any]]
"""`lift(channel, value, from_schema, to_schema)`: a stored value and its channel's name,
migrated."""


def known_values(state: ChannelState) -> tuple[dict[str, StoredChannel], list[str]]:
    """Channels whose decoded value this process holds, by head key, and every key
    they make unnecessary to fetch."""
    # Only our own string versions are unique per write; integer versions may be reused.
    held = (s.last_value() for s in state.values())
    known = {
        s.key: s
        for s in held
        if s is not None and isinstance(s.version, str) and s.known_value() is not UNKNOWN
    }
    return known, sorted({k for s in known.values() for k in s.chain})


class StateCache:
    """Bounded LRU of the channel state of recently written or read checkpoints."""

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._entries: OrderedDict[Any, ChannelState] = OrderedDict()
        self._latest: OrderedDict[Any, ChannelState] = OrderedDict()
        self._seeds: OrderedDict[Any, dict[str, str]] = OrderedDict()
        self._prefetched: OrderedDict[Any, Any] = OrderedDict()
        self._delta_scopes: OrderedDict[Any, bool] = OrderedDict()
        self._lock = threading.Lock()

    def seeds(self, key: tuple[str, str, str]) -> dict[str, str] | None:
        """Per delta channel, the checkpoint whose stored value seeds its history."""
        with self._lock:
            return self._seeds.get(key)

    def put_seeds(self, key: tuple[str, str, str], seeds: dict[str, str]) -> None:
        with self._lock:
            self._bounded(self._seeds, key, seeds)
            self._bounded(self._delta_scopes, key[:2], True)

    def has_delta_channels(self, thread_id: str, checkpoint_ns: str) -> bool:
        """Whether this process has seen `DeltaChannel` bookkeeping in a thread namespace."""
        with self._lock:
            return (thread_id, checkpoint_ns) in self._delta_scopes

    def prefetch(self, key: tuple[str, str, str], data: Any) -> None:
        """Keep what a read fetched ahead for the history call LangGraph makes next."""
        with self._lock:
            self._bounded(self._prefetched, key, data)

    def take_prefetched(self, key: tuple[str, str, str]) -> Any:
        with self._lock:
            return self._prefetched.pop(key, None)

    def _bounded(self, entries: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        entries[key] = value
        entries.move_to_end(key)
        while len(entries) > self._max:
            entries.popitem(last=False)

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

    def remember(self, key: tuple[str, str, str], state: ChannelState) -> None:
        """Cache a state read back, unless this process already holds the (richer) state
        it wrote for that checkpoint; either way it becomes the namespace's latest."""
        held = self.get(key)
        self.put(key, state if held is None else held)

    def put(self, key: tuple[str, str, str], state: ChannelState) -> None:
        if self._max <= 0:
            return
        with self._lock:
            self._bounded(self._entries, key, state)
            self._bounded(self._latest, key[:2], state)

    def discard_thread(self, thread_id: str) -> None:
        with self._lock:
            for entries in (self._entries, self._latest, self._seeds, self._prefetched,
                            self._delta_scopes):
                for k in [k for k in entries if k[0] == thread_id]:
                    del entries[k]


def list_items(value: Any) -> tuple[list[Any] | None, bool]:
    """The items of a list or of a `_DeltaSnapshot` of a list, and whether it is the latter."""
    if isinstance(value, _DeltaSnapshot) and isinstance(value.value, list):
        return value.value, True
    if isinstance(value, list):
        return value, False
    return None, False


def _extends(old: tuple[Any, ...], new: list[Any]) -> bool:
    if len(new) <= len(old):
        return False
    return all(a is b or a == b for a, b in zip(old, new, strict=False))


def append_level(levels: tuple[int, ...], merge_every: int) -> tuple[int, int]:
    """The merge level of the next append to a chain, and how much of the chain it keeps.

    Appends are log-structured: `merge_every` appends in a row at level 0 are replaced
    by one level-1 append holding all their items (written once, referring to what came
    before them), `merge_every` level-1 appends by one level-2 append, and so on. Each
    item is rewritten once per level, so the bytes a turn writes stay flat as a thread
    grows, and a read follows at most `merge_every` links per level.
    """
    level, cut = 0, len(levels)
    while True:
        run = 0
        while run < cut and levels[cut - 1 - run] == level:
            run += 1
        if run < merge_every:
            return level, cut
        cut -= run
        level += 1


@dataclass
class PlannedValues:
    entries: list[dict[str, Any]]
    blob_keys: list[str]
    """Keys of entries held by other documents that this checkpoint's state needs."""
    heads: dict[str, str]
    """Channel -> key of its value, where that is not `blob_key(channel, version)`."""
    empty: list[str]
    state: ChannelState


def plan_values(
    serde: SerializerProtocol,
    *,
    thread_id: str,
    channel_values: Mapping[str, Any],
    channel_versions: ChannelVersions,
    new_versions: ChannelVersions,
    parent: ChannelState | None,
    merge_every: int,
    schema_version: int,
) -> PlannedValues:
    """What a `put` stores for its channel values, given what the parent stored."""
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
                state[channel] = StoredChannel(version, key, (key,), known=False)
            elif previous.stale and channel in channel_values:
                key = f"{blob_key(channel, version)}@{schema_version}"
                entry, state[channel] = full_entry(
                    serde, channel, key, channel_values[channel], what, schema_version, version
                )
                entries.append(entry)
            else:
                state[channel] = previous
            continue
        version = new_versions[channel]
        key = blob_key(channel, version)
        if channel not in channel_values:
            carried = previous.last_value() if previous is not None else None
            state[channel] = StoredChannel(version, key, (), empty=True, carried=carried)
            continue
        value = channel_values[channel]
        items, snapshot = list_items(value)
        base = previous.last_value() if previous is not None else None
        if (
            items is not None
            and base is not None
            and base.items is not None
            and base.lengths
            and not base.stale
            and _extends(base.items, items)
        ):
            level, cut = append_level(base.levels, merge_every)
            if level <= MAX_LEVEL:
                payload = dump_typed(serde, items[base.lengths[cut - 1] :], what)
                entry = {"k": key, "c": channel, "sv": schema_version, "kind": "append",
                         "prev": base.chain[cut - 1], **payload}
                if level:
                    entry["l"] = level
                if snapshot:
                    entry["w"] = 1
                entries.append(entry)
                state[channel] = StoredChannel(
                    version, key, (*base.chain[:cut], key), (*base.levels[:cut], level),
                    (*base.lengths[:cut], len(items)), tuple(items), snapshot=snapshot,
                )
                continue
        entry, state[channel] = full_entry(
            serde, channel, key, value, what, schema_version, version
        )
        entries.append(entry)
    own = {e["k"] for e in entries}
    return PlannedValues(
        entries=entries,
        blob_keys=sorted({k for s in state.values() for k in s.chain} - own),
        heads={ch: s.key for ch, s in state.items() if s.key != blob_key(ch, s.version)},
        empty=[ch for ch, s in state.items() if s.empty],
        state=state,
    )


def full_entry(
    serde: SerializerProtocol,
    channel: str,
    key: str,
    value: Any,
    what: str,
    schema_version: int,
    version: str | int | float,
) -> tuple[dict[str, Any], StoredChannel]:
    payload = dump_typed(serde, value, what)
    entry = {"k": key, "c": channel, "sv": schema_version, "kind": "full", **payload}
    items, snapshot = list_items(value)
    stored = StoredChannel(
        version,
        key,
        (key,),
        (FULL,),
        (len(items),) if items is not None else (),
        items=tuple(items) if items is not None else None,
        scalar=value if isinstance(value, IMMUTABLE_TYPES) else UNKNOWN,
        snapshot=snapshot,
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
    empty: Iterable[str] = (),
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
    absent_keys, empty_channels = set(absent), set(empty)
    known = known or {}
    values: dict[str, Any] = {}
    state: ChannelState = {}
    missing: set[str] = set()
    for channel, version in channel_versions.items():
        key = heads.get(channel) or blob_key(channel, version)
        if channel in empty_channels:
            state[channel] = StoredChannel(version, key, (), empty=True)
            continue
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
        values[channel], state[channel] = _build(
            serde, channel, version, key, links, known.get(cursor) if cursor else None,
            schema_version, lift,
        )
    if missing:
        raise MissingBlobs(missing)
    return values, state


def _build(
    serde: SerializerProtocol,
    channel: str,
    version: str | int | float,
    key: str,
    links: list[Mapping[str, Any]],
    held: StoredChannel | None,
    schema_version: int,
    lift: Lift,
) -> tuple[Any, StoredChannel]:
    """One channel's value from a held value or a full entry, plus the appends after it."""
    what = f"channel {channel!r} at version {version!r}"
    if held is not None:  # the chain reached a value this process holds
        value, at, name = held.known_value(), schema_version, channel
        chain, levels, lengths = held.chain, held.levels, held.lengths
    else:
        base, links = links[0], links[1:]
        value = load_typed(serde, base, what)
        at, name = base.get("sv", schema_version), base["c"]
        base_items, _ = list_items(value)
        chain, levels = (base["k"],), (FULL,)
        lengths = (len(base_items),) if base_items is not None else ()
    if links:
        items, _ = list_items(value)
        if items is None:
            raise CorruptDocumentError(
                f"{what}: an append chain starts from a {type(value).__name__}, not a list"
            )
        value = items
    for link in links:
        link_sv = link.get("sv", at)
        if link_sv > at:
            (name, value), at = lift(name, value, at, link_sv), link_sv
        value = [*value, *load_typed(serde, link, what)]
        chain, levels = (*chain, link["k"]), (*levels, link.get("l", 0))
        lengths = (*lengths, len(value))
    if links and links[-1].get("w"):
        value = _DeltaSnapshot(value)
    if at < schema_version:
        name, value = lift(name, value, at, schema_version)
    items, snapshot = list_items(value)
    stored = StoredChannel(
        version, key, chain, levels, lengths,
        tuple(items) if items is not None else None,
        scalar=value if isinstance(value, IMMUTABLE_TYPES) else UNKNOWN, snapshot=snapshot,
    )
    return value, stored


def restate(stored: StoredChannel, **changes: Any) -> StoredChannel:
    """A copy of `stored` with some fields changed."""
    return replace(stored, **changes)
