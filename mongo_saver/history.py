"""Walking a thread's parent chain for `DeltaChannel` history, without I/O.

`AncestorWalk` is fed checkpoint skeletons newest first (one streamed query) and follows
parent pointers in memory. For each requested channel it collects the on-path checkpoints
whose writes count, and stops at the nearest ancestor whose version of the channel has a
stored, non-empty value (the seed), as LangGraph's contract describes.

A version's value entry usually sits in the checkpoint that introduced it, which is an
older document than the one being visited; until it is seen, the channel is "pending".
Entries moved to a newer survivor by `prune` or `delete_for_runs` are found either among
the documents already streamed or by the seed fetch that follows the walk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import DeltaChannelHistory, PendingWrite

from mongo_saver.documents import value_kinds

Document = dict[str, Any]
Header = Callable[[Mapping[str, Any]], tuple[dict[str, Any], dict[str, str]]]
"""A skeleton's channel versions and head keys, under the current channel names."""


class AncestorWalk:
    def __init__(self, channels: Sequence[str], target_id: str | None, header: Header) -> None:
        self.header = header
        self.channels = list(channels)
        self.remaining = set(channels)
        self.want: str | None = target_id
        self.at_target = True
        self.path_ended = False
        self.path: list[tuple[str, frozenset[str]]] = []
        self.kinds: dict[str, str] = {}
        self.pending: dict[str, tuple[str, int]] = {}
        self.seed_keys: dict[str, str] = {}
        self.seed_versions: dict[str, Any] = {}
        self.cut: dict[str, int] = {}

    @property
    def done(self) -> bool:
        return not self.remaining or (self.path_ended and not self.pending)

    def visit(self, doc: Mapping[str, Any]) -> None:
        for key, kind in value_kinds(doc).items():
            self.kinds.setdefault(key, kind)
        self._decide_pending(self.kinds)
        if self.path_ended or doc["checkpoint_id"] != (self.want or doc["checkpoint_id"]):
            return
        parent = doc.get("parent_checkpoint_id")
        self.want = parent
        self.path_ended = parent is None
        if self.at_target:  # the target's own writes and value do not count
            self.at_target = False
            return
        versions, heads = self.header(doc)
        self.path.append((doc["checkpoint_id"], frozenset(self.remaining)))
        index = len(self.path) - 1
        for ch in sorted(self.remaining - self.pending.keys()):
            if ch not in versions:
                continue
            key = heads[ch]
            self.seed_versions[ch] = versions[ch]
            if key in self.kinds:
                if self.kinds[key] != "empty":
                    self._seed(ch, key, index)
            else:
                self.pending[ch] = (key, index)

    def finish(self, kinds: Mapping[str, str]) -> None:
        """Decide channels still pending after the stream, from a direct fetch of keys."""
        self._decide_pending(kinds)
        self.pending.clear()

    def pending_keys(self) -> list[str]:
        return sorted(key for key, _ in self.pending.values())

    def _decide_pending(self, kinds: Mapping[str, str]) -> None:
        for ch, (key, index) in list(self.pending.items()):
            if key in kinds:
                del self.pending[ch]
                if kinds[key] != "empty":
                    self._seed(ch, key, index)

    def _seed(self, ch: str, key: str, index: int) -> None:
        self.seed_keys[ch] = key
        self.cut[ch] = index
        self.remaining.discard(ch)

    def path_ids(self) -> list[str]:
        return [cid for cid, _ in self.path]

    def result(
        self, writes: Iterable[tuple[str, PendingWrite]], seeds: Mapping[str, Any]
    ) -> dict[str, DeltaChannelHistory]:
        """Assemble the contract's shape from `(checkpoint_id, write)` pairs, oldest first."""
        position = {cid: (i, collecting) for i, (cid, collecting) in enumerate(self.path)}
        out: dict[str, DeltaChannelHistory] = {ch: {"writes": []} for ch in self.channels}
        for checkpoint_id, write in writes:
            ch = write[1]
            index, collecting = position.get(checkpoint_id, (-1, frozenset()))
            if ch not in collecting or index > self.cut.get(ch, index):
                continue
            out[ch]["writes"].append(write)
        for ch, value in seeds.items():
            out[ch]["seed"] = value
        return out


ROOT = ""
"""A delta history that reaches back to the thread's first checkpoint (sorts first)."""


def delta_starts(
    channels: Iterable[str],
    parent_id: str | None,
    parent: Mapping[str, Any] | None,
    parent_seeds: Mapping[str, str] | None,
) -> dict[str, str] | None:
    """Per delta channel, the oldest checkpoint a new child's history can reach (its seed
    ancestor, or ROOT); None when this process cannot tell (it did not write or read the
    parent with its delta bookkeeping)."""
    starts: dict[str, str] = {}
    for ch in channels:
        if parent_id is None:
            starts[ch] = ROOT
            continue
        if parent is None or parent_seeds is None:
            return None
        stored = parent.get(ch)
        if stored is not None and not stored.known:
            return None
        if stored is not None and not stored.empty:
            starts[ch] = parent_id  # the parent stores a value: the walk stops there
        elif ch in parent_seeds:
            starts[ch] = parent_seeds[ch]  # empty or not yet a channel: as far as the parent
        else:
            return None
    return starts


def own_seeds(
    checkpoint_id: str, starts: Mapping[str, str], state: Mapping[str, Any]
) -> dict[str, str]:
    """What a checkpoint's children inherit: itself where it stores the channel's value."""
    return {
        ch: checkpoint_id if ch in state and state[ch].known and not state[ch].empty else start
        for ch, start in starts.items()
    }
