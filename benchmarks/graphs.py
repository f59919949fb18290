"""The graphs the benchmark runs: a one-node chat, plain or with a `DeltaChannel`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

MESSAGE_CHARS = 200
_FILLER = (
    "The quick brown fox jumps over the lazy dog while the checkpointer takes notes. "
    "Every turn adds a question and an answer of about two hundred characters each. "
)


def text(kind: str, turn: int, chars: int = MESSAGE_CHARS) -> str:
    """A deterministic message body of exactly ``chars`` characters."""
    head = f"[{kind} {turn}] "
    body = (_FILLER * (chars // len(_FILLER) + 2))[: chars - len(head)]
    return head + body


def human(turn: int) -> HumanMessage:
    return HumanMessage(content=text("human", turn))


def ai(turn: int) -> AIMessage:
    return AIMessage(content=text("ai", turn))


def messages(n: int) -> list[AnyMessage]:
    """``n`` alternating human/AI messages with stable ids, as a state of that length."""
    out: list[AnyMessage] = []
    for i in range(n):
        msg: AnyMessage = human(i // 2) if i % 2 == 0 else ai(i // 2)
        msg.id = f"m-{i:06d}"
        out.append(msg)
    return out


def add_messages_batch(state: Sequence[Any], writes: Sequence[Any]) -> list[Any]:
    """`add_messages` folded over a batch of writes: the `DeltaChannel` reducer shape."""
    result: list[Any] = list(state)
    for write in writes:
        result = add_messages(result, write)
    return result


class ChatState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _reply(state: dict[str, Any]) -> dict[str, Any]:
    last = state["messages"][-1]
    turn = int(str(last.content).split()[1].rstrip("]")) if last.content else 0
    return {"messages": [ai(turn)]}


def chat_graph(*, delta: bool = False, snapshot_frequency: int = 100) -> StateGraph:
    """One node answering each human message with one AI message: 2 messages per turn.

    With ``delta`` the ``messages`` channel is a `DeltaChannel` folding `add_messages`,
    declared in the state schema as ``Annotated[list, DeltaChannel(reducer)]``.
    """
    schema: type
    if delta:
        channel = DeltaChannel(add_messages_batch, snapshot_frequency=snapshot_frequency)

        # Functional form: the channel object is a local, which a class body's (postponed)
        # annotation could not name.
        schema = TypedDict(  # type: ignore[operator]  # noqa: UP013
            "DeltaChatState", {"messages": Annotated[list[AnyMessage], channel]})
    else:
        schema = ChatState
    builder = StateGraph(schema)
    builder.add_node("bot", _reply)
    builder.add_edge(START, "bot")
    builder.add_edge("bot", END)
    return builder


def turn_input(turn: int) -> dict[str, Any]:
    return {"messages": [human(turn)]}


class CounterState(TypedDict):
    n: int


def _count(state: dict[str, Any]) -> dict[str, Any]:
    return {"n": state["n"] + 1}


def counter_graph() -> StateGraph:
    """A graph with a tiny state: 3 checkpoints and 2 pending writes per turn, no payload."""
    builder = StateGraph(CounterState)
    builder.add_node("count", _count)
    builder.add_edge(START, "count")
    builder.add_edge("count", END)
    return builder


def counter_input(turn: int) -> dict[str, Any]:
    return {"n": turn}
