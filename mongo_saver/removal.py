"""Deciding what `prune` and `delete_for_runs` may delete, without I/O.

Two things can make a surviving checkpoint depend on one that is about to go:

* its channel values: a value entry lives in the checkpoint that introduced the version,
  and append chains reach back further. Entries a survivor needs are moved to the
  newest survivor of the namespace before anything is deleted.
* its `DeltaChannel` history: a channel stored as an empty sentinel is rebuilt from the
  writes of its ancestors back to the nearest stored value. Those ancestors are kept,
  with their writes, so the channel never silently rebuilds as empty.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mongo_saver.documents import (
    blob_key,
    channel_versions_of,
    head_keys,
    unescape_field,
    unescape_keys,
    value_kinds,
)

Document = dict[str, Any]
Scope = tuple[str, str]  # (thread_id, checkpoint_ns)
DELTA_COUNTERS = "counters_since_delta_snapshot"


@dataclass
class RemovalPlan:
    moves: dict[Scope, tuple[Any, set[str]]] = field(default_factory=dict)
    """Per namespace: the survivor's `_id` and the keys of entries to copy into it."""
    deletions: dict[Scope, set[str]] = field(default_factory=dict)
    retained: int = 0
    """Checkpoints outside `keep` kept because a survivor's delta history runs through them."""


def plan_removal(skeletons: Iterable[Mapping[str, Any]], keep: set[tuple[str, str]]) -> RemovalPlan:
    """Plan the removal of every skeleton whose `(checkpoint_ns, checkpoint_id)` is not kept."""
    by_scope: dict[Scope, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for doc in skeletons:
        by_scope[(doc["thread_id"], doc["checkpoint_ns"])][doc["checkpoint_id"]] = doc
    plan = RemovalPlan()
    for scope, docs in by_scope.items():
        kept = {cid for cid in docs if (scope[1], cid) in keep}
        kept_all = kept | _delta_ancestors(docs, kept)
        plan.retained += len(kept_all - kept)
        doomed = set(docs) - kept_all
        if not doomed:
            continue
        plan.deletions[scope] = doomed
        if not kept_all:
            continue
        holder = {e["k"]: cid for cid, d in docs.items() for e in d.get("values", [])}
        prev = {e["k"]: e["prev"] for d in docs.values() for e in d.get("values", [])
                if e.get("prev")}
        needed = _closure(
            (k for cid in kept_all for k in _keys_of(docs[cid])), prev
        )
        to_move = {k for k in needed if holder.get(k) in doomed}
        if to_move:
            survivor = docs[max(kept_all)]
            plan.moves[scope] = (survivor["_id"], to_move)
    return plan


def _keys_of(doc: Mapping[str, Any]) -> Iterable[str]:
    yield from doc.get("blob_keys", [])
    yield from head_keys(doc).values()


def _closure(keys: Iterable[str], prev: Mapping[str, str]) -> set[str]:
    out: set[str] = set()
    stack = list(keys)
    while stack:
        key = stack.pop()
        if key not in out:
            out.add(key)
            if key in prev:
                stack.append(prev[key])
    return out


def _delta_ancestors(docs: Mapping[str, Mapping[str, Any]], kept: set[str]) -> set[str]:
    """Ancestors on the path from each kept checkpoint to its delta channels' seeds.

    Delta channels are the ones LangGraph counts in `counters_since_delta_snapshot`;
    other channels stored without a value (consumed triggers such as `__start__`) need
    no history.
    """
    kinds = {k: kind for d in docs.values() for k, kind in value_kinds(d).items()}
    delta_channels = {
        unescape_field(ch)
        for d in docs.values()
        for ch in (d.get("metadata") or {}).get(DELTA_COUNTERS, {})
    }
    extra: set[str] = set()
    for cid in kept:
        heads = _all_heads(docs[cid])
        waiting = {ch for ch, key in heads.items()
                   if ch in delta_channels and kinds.get(key, "empty") == "empty"}
        parent: str | None = docs[cid].get("parent_checkpoint_id")
        while waiting and parent is not None and parent in docs:
            extra.add(parent)
            ancestor_heads = _all_heads(docs[parent])
            for ch in list(waiting):
                key = ancestor_heads.get(ch)
                if key is not None and kinds.get(key, "empty") != "empty":
                    waiting.discard(ch)
            parent = docs[parent].get("parent_checkpoint_id")
    return extra - kept


def _all_heads(doc: Mapping[str, Any]) -> dict[str, str]:
    """Channel -> the key its version's value would have, stored or not."""
    heads = unescape_keys(doc.get("heads") or {})
    return {ch: heads.get(ch) or blob_key(ch, v) for ch, v in channel_versions_of(doc).items()}
