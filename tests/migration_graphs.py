"""The v1 and v2 graphs of the migration tests (issue 3's scenario), with and without
DeltaChannels. Node names and edges are the same in both versions, so a run that
failed under v1 resumes under v2.

START -> retrieve, classify (in parallel) -> respond -> END
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from mongo_saver import SchemaMigrations
from mongo_saver.migrations import load_migrations

REPO = Path(__file__).resolve().parent.parent


def demo_migrations() -> SchemaMigrations:
    """The project's own migrations folder: v1 -> v2 of this scenario."""
    return load_migrations(REPO / "migrations")


def concat(state: list[Any], writes: Sequence[Any]) -> list[Any]:
    out = list(state)
    for w in writes:
        out.extend(w if isinstance(w, list) else [w])
    return out


def append_messages(state: list[Any], writes: Sequence[Any]) -> list[Any]:
    for w in writes:
        state = add_messages(state, w)
    return state


class V1(TypedDict):
    messages: Annotated[list[Any], add_messages]
    retrieved_context: Annotated[list[str], operator.add]
    route: str


class V2(TypedDict):
    messages: Annotated[list[Any], add_messages]
    context: Annotated[list[dict[str, Any]], operator.add]
    route: str
    summary: str


class V1Delta(TypedDict):
    messages: Annotated[list[Any], DeltaChannel(append_messages, snapshot_frequency=4)]
    retrieved_context: Annotated[list[str], DeltaChannel(concat, snapshot_frequency=3)]
    route: str


class V2Delta(TypedDict):
    messages: Annotated[list[Any], DeltaChannel(append_messages, snapshot_frequency=4)]
    context: Annotated[list[dict[str, Any]], DeltaChannel(concat, snapshot_frequency=3)]
    route: str
    summary: str


class Switch:
    """Lets a test make `classify` fail on demand."""

    fail = False


def _last_text(state: dict[str, Any]) -> str:
    return str(state["messages"][-1].content)


def v1_graph(checkpointer: Any, *, delta: bool = False) -> Any:
    def retrieve(state: dict[str, Any]) -> dict[str, Any]:
        return {"retrieved_context": [f"doc about {_last_text(state)}"]}

    def classify(state: dict[str, Any]) -> dict[str, Any]:
        if Switch.fail:
            raise RuntimeError("classifier is down")
        return {"route": "faq" if "?" in _last_text(state) else "chat"}

    def respond(state: dict[str, Any]) -> dict[str, Any]:
        n = len(state["retrieved_context"])
        return {"messages": [AIMessage(content=f"{n} docs")]}

    return _build(V1Delta if delta else V1, retrieve, classify, respond, checkpointer)


def v2_graph(checkpointer: Any, *, delta: bool = False) -> Any:
    def retrieve(state: dict[str, Any]) -> dict[str, Any]:
        return {"context": [{"text": f"doc about {_last_text(state)}"}]}

    def classify(state: dict[str, Any]) -> dict[str, Any]:
        return {"route": "FAQ" if "?" in _last_text(state) else "CHAT"}

    def respond(state: dict[str, Any]) -> dict[str, Any]:
        texts = [item["text"] for item in state["context"]]  # fails on an unmigrated item
        return {"messages": [AIMessage(content=f"{len(texts)} docs")]}

    return _build(V2Delta if delta else V2, retrieve, classify, respond, checkpointer)


def _build(state: type, retrieve: Any, classify: Any, respond: Any, checkpointer: Any) -> Any:
    builder = StateGraph(state)
    builder.add_node("retrieve", retrieve)
    builder.add_node("classify", classify)
    builder.add_node("respond", respond)
    builder.add_edge(START, "retrieve")
    builder.add_edge(START, "classify")
    builder.add_edge(["retrieve", "classify"], "respond")
    builder.add_edge("respond", END)
    return builder.compile(checkpointer=checkpointer)
