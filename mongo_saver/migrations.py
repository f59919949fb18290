"""Application schema migrations, applied lazily to checkpoints as they are read.

A migration step upgrades `schema_version` N to N+1. It is declared once, as a list of
channel operations recorded by the step function::

    migrations = SchemaMigrations()

    @migrations.step(1)
    def split_context(m: StepBuilder) -> None:
        m.rename_channel("retrieved_context", "context")
        m.map_items("context", lambda text: {"text": text})   # accumulating channel
        m.map_value("route", str.upper)                       # replaced channel
        m.add_channel("summary", default="")
        m.drop_channel("scratch")

Declared operations know whether a channel accumulates or is replaced, so each one is
applied consistently to every place a channel's data lives: the stored value (a plain
list, a `_DeltaSnapshot`, an append chain), each pending write (a delta for an
accumulating channel, a whole value for a replaced one), `channel_versions`,
`versions_seen` and the writes and seeds of delta-channel history. Replaying migrated
writes through the reducer therefore gives the migrated state.

`m.raw(fn)` is the escape hatch: `fn(checkpoint, pending_writes)` returns both, changed.
It sees whole checkpoints only, so it cannot migrate `DeltaChannel` history.

Transforms must be deterministic: concurrent readers of one old checkpoint each migrate
it, and whichever writes back first wins.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import PendingWrite
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from mongo_saver.errors import MigrationError

ADDED_CHANNEL_VERSION = f"{1:016}.{0:010}"
"""The version given to a channel that a migration adds; deterministic across readers."""


class _Dropped:
    """Marks a channel (or write) that a migration removed."""


DROPPED = _Dropped()

RawFn = Callable[[dict[str, Any], list[PendingWrite]], tuple[dict[str, Any], list[PendingWrite]]]


@dataclass(frozen=True, slots=True)
class RenameChannel:
    old: str
    new: str


@dataclass(frozen=True, slots=True)
class MapItems:
    """Transform each item of an accumulating (list-valued, reducer) channel."""

    channel: str
    fn: Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class MapValue:
    """Transform the whole value of a replaced (last-value) channel."""

    channel: str
    fn: Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class AddChannel:
    channel: str
    default: Any


@dataclass(frozen=True, slots=True)
class DropChannel:
    channel: str


@dataclass(frozen=True, slots=True)
class Raw:
    fn: RawFn


Operation = RenameChannel | MapItems | MapValue | AddChannel | DropChannel | Raw


class StepBuilder:
    """The `m` handed to a step function: records the step's operations in order."""

    def __init__(self) -> None:
        self.operations: list[Operation] = []

    def rename_channel(self, old: str, new: str) -> None:
        self.operations.append(RenameChannel(old, new))

    def map_items(self, channel: str, fn: Callable[[Any], Any]) -> None:
        self.operations.append(MapItems(channel, fn))

    def map_value(self, channel: str, fn: Callable[[Any], Any]) -> None:
        self.operations.append(MapValue(channel, fn))

    def add_channel(self, channel: str, default: Any) -> None:
        self.operations.append(AddChannel(channel, default))

    def drop_channel(self, channel: str) -> None:
        self.operations.append(DropChannel(channel))

    def raw(self, fn: RawFn) -> None:
        self.operations.append(Raw(fn))


@dataclass(frozen=True)
class MigrationStep:
    version: int
    """This step upgrades `version` to `version + 1`."""
    name: str
    operations: tuple[Operation, ...]

    @property
    def is_raw(self) -> bool:
        return any(isinstance(op, Raw) for op in self.operations)


@dataclass
class SchemaMigrations:
    """An ordered registry of migration steps, numbered from 1 without gaps."""

    steps: dict[int, MigrationStep] = field(default_factory=dict)

    def step(self, version: int) -> Callable[[Callable[[StepBuilder], None]], Any]:
        """Register a step upgrading `version` to `version + 1` (a decorator)."""
        if not isinstance(version, int) or version < 1:
            raise ValueError(f"migration step version must be an int >= 1, got {version!r}")
        if version in self.steps:
            raise ValueError(f"migration step {version} is registered twice")

        def register(fn: Callable[[StepBuilder], None]) -> Callable[[StepBuilder], None]:
            builder = StepBuilder()
            fn(builder)
            self.steps[version] = MigrationStep(version, fn.__name__, tuple(builder.operations))
            self._check_contiguous()
            return fn

        return register

    def _check_contiguous(self) -> None:
        expected = list(range(1, len(self.steps) + 1))
        if sorted(self.steps) != expected and max(self.steps) == len(self.steps):
            raise ValueError(f"migration steps must be numbered 1..N, got {sorted(self.steps)}")

    @property
    def current_version(self) -> int:
        """The schema version new checkpoints are written with."""
        if sorted(self.steps) != list(range(1, len(self.steps) + 1)):
            raise ValueError(f"migration steps must be numbered 1..N, got {sorted(self.steps)}")
        return len(self.steps) + 1

    def path(self, from_version: int, to_version: int | None = None) -> list[MigrationStep]:
        """The steps taking `from_version` to `to_version` (default: current)."""
        end = self.current_version if to_version is None else to_version
        return [self.steps[v] for v in range(from_version, end)]

    def crosses_raw(self, from_version: int, to_version: int | None = None) -> bool:
        return any(step.is_raw for step in self.path(from_version, to_version))

    def historical_names(self, channel: str, from_version: int) -> set[str]:
        """Every name `channel` (a current name) had since `from_version`."""
        names = {channel}
        for step in reversed(self.path(from_version)):
            for op in reversed(step.operations):
                if isinstance(op, RenameChannel) and op.new in names:
                    names.add(op.old)
        return names

    def validate(self, graph: Any) -> list[str]:
        """Problems of steps that treat a compiled graph's channels the wrong way.

        `map_items` on a channel the graph replaces, or `map_value` on one it accumulates
        with a reducer, would corrupt state on replay; each is reported as one line.
        """
        accumulating, replaced = channel_kinds(graph)
        problems = []
        for step in self.steps.values():
            names = _names_after(self, step.version)
            for op in step.operations:
                if isinstance(op, MapItems):
                    final = names(op.channel)
                    if final in replaced:
                        problems.append(
                            f"step {step.version} ({step.name}): map_items on {op.channel!r}, "
                            f"which the graph replaces (last value); use map_value"
                        )
                elif isinstance(op, MapValue):
                    final = names(op.channel)
                    if final in accumulating:
                        problems.append(
                            f"step {step.version} ({step.name}): map_value on {op.channel!r}, "
                            f"which the graph accumulates with a reducer; use map_items"
                        )
        return problems


def _names_after(migrations: SchemaMigrations, version: int) -> Callable[[str], str]:
    """Map a channel name as of the end of step `version` to its current name."""

    def final(name: str) -> str:
        for step in migrations.path(version + 1):
            for op in step.operations:
                if isinstance(op, RenameChannel) and op.old == name:
                    name = op.new
        return name

    return final


def channel_kinds(graph: Any) -> tuple[set[str], set[str]]:
    """(accumulating, replaced) state channels of a compiled LangGraph graph."""
    from langgraph.channels.binop import BinaryOperatorAggregate
    from langgraph.channels.delta import DeltaChannel
    from langgraph.channels.last_value import LastValue

    accumulating, replaced = set(), set()
    for name, channel in graph.channels.items():
        if isinstance(channel, (BinaryOperatorAggregate, DeltaChannel)):
            accumulating.add(name)
        elif isinstance(channel, LastValue):
            replaced.add(name)
    return accumulating, replaced


def load_migrations(folder: str | Path) -> SchemaMigrations:
    """Load one file per step from `folder` (`0001_name.py`, ...) into a registry.

    Each file defines `VERSION` (the schema version it upgrades from) and a function
    `upgrade(m)`; files are applied in the order of their numeric prefix.
    """
    migrations = SchemaMigrations()
    files = sorted(Path(folder).glob("[0-9]*.py"), key=lambda p: int(re.split(r"\D", p.name)[0]))
    for path in files:
        spec = importlib.util.spec_from_file_location(f"mongo_saver_migration_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot load migration file {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        version = getattr(module, "VERSION", None)
        upgrade = getattr(module, "upgrade", None)
        if not isinstance(version, int) or not callable(upgrade):
            raise ValueError(f"{path} must define VERSION (int) and upgrade(m)")
        migrations.step(version)(upgrade)
    return migrations


# --- applying operations -------------------------------------------------------------------


def _map_items(fn: Callable[[Any], Any], value: Any) -> Any:
    """Apply an item transform to an accumulated value or a delta, whatever its wrapper."""
    from langgraph.types import Overwrite

    if isinstance(value, _DeltaSnapshot):
        return _DeltaSnapshot(_map_items(fn, value.value))
    if isinstance(value, Overwrite):
        return Overwrite(_map_items(fn, value.value))
    if isinstance(value, (list, tuple)):
        return type(value)(fn(item) for item in value)
    return fn(value)  # a single item written to an accumulating channel


def _map_value(fn: Callable[[Any], Any], value: Any) -> Any:
    if isinstance(value, _DeltaSnapshot):
        return _DeltaSnapshot(fn(value.value))
    return fn(value)


class MigrationContext:
    """Names the thread, checkpoint and step when a user transform raises."""

    def __init__(self, thread_id: str, checkpoint_id: str) -> None:
        self.thread_id = thread_id
        self.checkpoint_id = checkpoint_id

    def fail(self, step: MigrationStep, exc: Exception) -> MigrationError:
        return MigrationError(
            f"migration step {step.version} ({step.name}) failed on thread "
            f"{self.thread_id!r}, checkpoint {self.checkpoint_id}: "
            f"{type(exc).__name__}: {exc}"
        )


def migrate_value(
    steps: Sequence[MigrationStep], channel: str, value: Any, ctx: MigrationContext
) -> tuple[str, Any]:
    """Carry one channel's stored value through `steps`; the value may become DROPPED."""
    for step in steps:
        try:
            for op in step.operations:
                if value is DROPPED:
                    break
                if isinstance(op, RenameChannel) and op.old == channel:
                    channel = op.new
                elif isinstance(op, MapItems) and op.channel == channel:
                    value = _map_items(op.fn, value)
                elif isinstance(op, MapValue) and op.channel == channel:
                    value = _map_value(op.fn, value)
                elif isinstance(op, DropChannel) and op.channel == channel:
                    value = DROPPED
        except Exception as exc:
            raise ctx.fail(step, exc) from exc
    return channel, value


def migrate_header(
    steps: Sequence[MigrationStep],
    channel_versions: dict[str, Any],
    versions_seen: dict[str, dict[str, Any]],
    heads: dict[str, str],
    updated_channels: list[str] | None,
) -> tuple[
    dict[str, Any], dict[str, dict[str, Any]], dict[str, str], list[str] | None, dict[str, Any]
]:
    """Rename, add and drop channels in a checkpoint's bookkeeping; returns added values."""
    versions = dict(channel_versions)
    seen = {node: dict(s) for node, s in versions_seen.items()}
    heads = dict(heads)
    updated = list(updated_channels) if updated_channels is not None else None
    added: dict[str, Any] = {}
    for step in steps:
        for op in step.operations:
            if isinstance(op, RenameChannel):
                _rename_key(versions, op.old, op.new)
                _rename_key(heads, op.old, op.new)
                _rename_key(added, op.old, op.new)
                for node_seen in seen.values():
                    _rename_key(node_seen, op.old, op.new)
                if updated is not None:
                    updated = [op.new if c == op.old else c for c in updated]
            elif isinstance(op, AddChannel) and op.channel not in versions:
                versions[op.channel] = _added_version(versions)
                added[op.channel] = op.default
            elif isinstance(op, DropChannel):
                versions.pop(op.channel, None)
                heads.pop(op.channel, None)
                added.pop(op.channel, None)
                for node_seen in seen.values():
                    node_seen.pop(op.channel, None)
                if updated is not None:
                    updated = [c for c in updated if c != op.channel]
    return versions, seen, heads, updated, added


def _added_version(versions: Mapping[str, Any]) -> str | int:
    """The lowest version, of the same type as the thread's (LangGraph compares them)."""
    if any(isinstance(v, int) for v in versions.values()):
        return 1
    return ADDED_CHANNEL_VERSION


def _rename_key(mapping: dict[str, Any], old: str, new: str) -> None:
    if old in mapping:
        mapping[new] = mapping.pop(old)


def apply_raw_steps(
    steps: Sequence[MigrationStep],
    checkpoint: dict[str, Any],
    writes: list[PendingWrite],
    ctx: MigrationContext,
) -> tuple[dict[str, Any], list[PendingWrite]]:
    for step in steps:
        for op in step.operations:
            if isinstance(op, Raw):
                try:
                    checkpoint, writes = op.fn(checkpoint, list(writes))
                except Exception as exc:
                    raise ctx.fail(step, exc) from exc
    return checkpoint, writes
