"""A guided tour of mongo-saver: ``python -m mongo_saver.demo``.

A small agent graph (rule-based, no LLM or network) runs against MongoDB and the tour
prints, in plain words, what the checkpointer gives it:

1. conversation memory across invocations on one thread;
2. a crash inside a node, then a resume in a fresh process with ``invoke(None, config)``;
3. time travel: the history, a replay from a past checkpoint, an ``update_state`` fork;
4. a live schema migration (v1 -> v2) of that existing thread with the steps in the
   top-level ``migrations/`` folder, applied lazily as the new code reads it;
5. what an operator sees with the ``mongo-saver`` CLI.

With ``MONGODB_URI`` set the demo uses that server (database ``mongo_saver_demo``);
otherwise it starts a local in-memory SecantusDB test server (installed by
``scripts/bootstrap``) and stops it at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import operator
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pymongo import MongoClient

from mongo_saver import MongoSaver, SchemaMigrations
from mongo_saver.migrations import load_migrations

ROOT = Path(__file__).resolve().parent.parent
MIGRATIONS_DIR = ROOT / "migrations"
DEMO_DB = "mongo_saver_demo"
THREAD = "demo-chat"
BYSTANDER = "demo-untouched"

KNOWLEDGE = {
    "checkpoint": "A checkpoint is a snapshot of the graph's state saved after every step.",
    "mongodb": "MongoDB stores each checkpoint as one BSON document, indexed by thread.",
    "langgraph": "LangGraph runs an agent as a graph of nodes that share one state.",
    "migration": "A schema migration upgrades old checkpoints when new code reads them.",
}

NODE_LOG: list[str] = []
"""Nodes run in this process, in order (to show what a resume did and did not repeat)."""

_crash_next_assistant = False


# --- the agent, schema v1 ------------------------------------------------------------------


class StateV1(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    retrieved_context: Annotated[list[str], operator.add]
    route: str


def _last_user_text(messages: list[AnyMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return str(message.content)
    return ""


def _topics(text: str) -> list[str]:
    lowered = text.lower()
    return [topic for topic in KNOWLEDGE if topic in lowered]


def _remembered_name(messages: list[AnyMessage]) -> str | None:
    name = None
    for message in messages:
        if isinstance(message, HumanMessage):
            found = re.search(r"\b(?:my name is|i'm|i am|call me)\s+([A-Z][a-z]+)",
                              str(message.content))
            if found:
                name = found.group(1)
    return name


def _reply(messages: list[AnyMessage], context_texts: list[str]) -> str:
    """The rule-based 'assistant': memory of the user's name, answers from context."""
    question = _last_user_text(messages)
    name = _remembered_name(messages)
    if "my name" in question.lower() and "?" in question:
        return f"Your name is {name}." if name else "You have not told me your name yet."
    topics = _topics(question)
    if topics:
        facts = [t for t in context_texts if any(topic in t.lower() for topic in topics)]
        return "From my notes: " + (facts[-1] if facts else "nothing found.")
    if name and name.lower() in question.lower():
        return f"Nice to meet you, {name}."
    return "Noted." if not name else f"Noted, {name}."


def router_v1(state: StateV1) -> dict[str, Any]:
    NODE_LOG.append("router")
    return {"route": "search" if _topics(_last_user_text(state["messages"])) else "chat"}


def retrieve_v1(state: StateV1) -> dict[str, Any]:
    NODE_LOG.append("retrieve")
    return {"retrieved_context": [KNOWLEDGE[t] for t in
                                  _topics(_last_user_text(state["messages"]))]}


def assistant_v1(state: StateV1) -> dict[str, Any]:
    global _crash_next_assistant
    NODE_LOG.append("assistant")
    if _crash_next_assistant:
        _crash_next_assistant = False
        raise RuntimeError("simulated crash inside the assistant node")
    return {"messages": [AIMessage(_reply(state["messages"], state["retrieved_context"]))]}


def build_v1(saver: MongoSaver) -> Any:
    return _build(saver, StateV1, router_v1, retrieve_v1, assistant_v1, search_route="search")


# --- the agent, schema v2 ------------------------------------------------------------------


class StateV2(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    context: Annotated[list[dict[str, Any]], operator.add]
    route: str
    summary: str


def router_v2(state: StateV2) -> dict[str, Any]:
    NODE_LOG.append("router")
    return {"route": "SEARCH" if _topics(_last_user_text(state["messages"])) else "CHAT"}


def retrieve_v2(state: StateV2) -> dict[str, Any]:
    NODE_LOG.append("retrieve")
    return {"context": [{"text": KNOWLEDGE[t], "source": t} for t in
                        _topics(_last_user_text(state["messages"]))]}


def assistant_v2(state: StateV2) -> dict[str, Any]:
    NODE_LOG.append("assistant")
    texts = [item["text"] for item in state["context"]]
    answer = _reply(state["messages"], texts)
    name = _remembered_name(state["messages"]) or "someone"
    turns = sum(isinstance(m, HumanMessage) for m in state["messages"])
    return {
        "messages": [AIMessage(answer)],
        "summary": f"{turns} questions from {name}; {len(texts)} notes retrieved so far.",
    }


def build_v2(saver: MongoSaver) -> Any:
    return _build(saver, StateV2, router_v2, retrieve_v2, assistant_v2, search_route="SEARCH")


def _build(
    saver: MongoSaver, state: type, router: Any, retrieve: Any, assistant: Any,
    *, search_route: str,
) -> Any:
    """The same graph in both versions (so a run can resume across the deploy)."""
    builder: StateGraph[Any] = StateGraph(state)
    builder.add_node("router", router)
    builder.add_node("retrieve", retrieve)
    builder.add_node("assistant", assistant)
    builder.add_edge(START, "router")
    builder.add_conditional_edges(
        "router", lambda s: "retrieve" if s["route"] == search_route else "assistant",
        ["retrieve", "assistant"],
    )
    builder.add_edge("retrieve", "assistant")
    builder.add_edge("assistant", END)
    return builder.compile(checkpointer=saver)


# --- printing -------------------------------------------------------------------------------


def say(text: str = "") -> None:
    print(text, flush=True)


def section(number: int, title: str) -> None:
    say()
    say(f"=== {number}. {title}")


def _short(checkpoint_id: str) -> str:
    return checkpoint_id[:8] + "..." + checkpoint_id[-4:]


def ask(graph: Any, config: dict[str, Any], text: str) -> str:
    say(f"  user:      {text}")
    result = graph.invoke({"messages": [HumanMessage(text)]}, config)
    answer = str(result["messages"][-1].content)
    say(f"  assistant: {answer}")
    return answer


def _config(thread_id: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread_id}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _schema_versions(client: MongoClient[dict[str, Any]], db: str, thread: str) -> str:
    counts: dict[Any, int] = {}
    for doc in client[db]["checkpoints"].find({"thread_id": thread}, {"schema_version": 1}):
        version = doc.get("schema_version")
        counts[version] = counts.get(version, 0) + 1
    return ", ".join(f"{n} at v{v}" for v, n in sorted(counts.items())) or "none"


def _load_migrations() -> SchemaMigrations:
    if not MIGRATIONS_DIR.is_dir():
        raise SystemExit(f"the demo's migrations folder {MIGRATIONS_DIR} is missing")
    return load_migrations(MIGRATIONS_DIR)


# --- the tour -------------------------------------------------------------------------------


def tour(uri: str, db: str) -> None:
    client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=10_000)
    try:
        _tour(client, uri, db)
    finally:
        client.close()


def _tour(client: MongoClient[dict[str, Any]], uri: str, db: str) -> None:
    saver = MongoSaver(client, db)
    saver.setup()
    for thread in (THREAD, BYSTANDER):
        saver.delete_thread(thread)
    graph = build_v1(saver)
    config = _config(THREAD)

    section(1, "Memory: three separate invocations on one thread")
    say(f"Each call passes only the new message and thread_id={THREAD!r}; the rest of the")
    say("conversation comes back from MongoDB.")
    ask(graph, config, "Hi, my name is Ada.")
    ask(graph, config, "What is a checkpoint?")
    ask(graph, config, "Do you remember my name?")
    state = graph.get_state(config)
    say(f"The thread now holds {len(state.values['messages'])} messages and "
        f"{len(state.values['retrieved_context'])} retrieved note(s).")
    graph.invoke({"messages": [HumanMessage("I am Bob. Tell me about LangGraph.")]},
                 _config(BYSTANDER))
    say(f"(A second thread, {BYSTANDER!r}, got one turn and will never be read again.)")

    section(2, "A crash inside a node, resumed by a fresh process")
    global _crash_next_assistant
    _crash_next_assistant = True
    NODE_LOG.clear()
    say("  user:      Tell me about MongoDB.")
    try:
        graph.invoke({"messages": [HumanMessage("Tell me about MongoDB.")]}, config)
    except RuntimeError as exc:
        say(f"  The run failed: {exc}.")
    say(f"  Nodes started in this run: {', '.join(NODE_LOG)}.")
    state = graph.get_state(config)
    say(f"  Saved state: next = {state.next}, retrieved notes so far = "
        f"{len(state.values['retrieved_context'])}.")
    say("  Starting a new Python process that builds its own saver and calls "
        "invoke(None, config)...")
    child = subprocess.run(
        [sys.executable, "-m", "mongo_saver.demo", "--resume-thread", THREAD, "--db", db],
        env={**os.environ, "MONGODB_URI": uri},
        capture_output=True,
        text=True,
        timeout=300,
    )
    for line in child.stdout.splitlines():
        say(f"  | {line}")
    if child.returncode != 0:
        sys.stderr.write(child.stderr)
        raise RuntimeError(f"the resuming process failed with exit code {child.returncode}")
    state = graph.get_state(config)
    say(f"  Back in the first process the thread ends with: "
        f"{state.values['messages'][-1].content!r}")
    main_head = state.config["configurable"]["checkpoint_id"]

    section(3, "Time travel")
    history = list(graph.get_state_history(config))
    say(f"get_state_history lists {len(history)} checkpoints, newest first (first 6):")
    for snapshot in history[:6]:
        meta = snapshot.metadata or {}
        checkpoint_id = snapshot.config["configurable"]["checkpoint_id"]
        say(f"  step {meta.get('step'):>2}  {meta.get('source'):<6} "
            f"next={snapshot.next!s:<16} {_short(checkpoint_id)}")
    before_answer = next(s for s in history if s.next == ("assistant",))
    step = (before_answer.metadata or {}).get("step")
    say(f"Replaying from step {step}, just before the assistant answered "
        f"{_last_user_text(before_answer.values['messages'])!r}:")
    NODE_LOG.clear()
    replayed = graph.invoke(None, before_answer.config)
    say(f"  the assistant ran again ({', '.join(NODE_LOG)}) and answered: "
        f"{replayed['messages'][-1].content!r}")
    first_turn = next(
        s for s in reversed(history)
        if not s.next and any(isinstance(m, AIMessage) for m in s.values.get("messages", []))
    )
    say("Forking from the end of the first turn with update_state, as if the user had said "
        "something else:")
    fork_config = graph.update_state(
        first_turn.config, {"messages": [HumanMessage("Sorry, I misspoke: call me Grace.")]}
    )
    say(f"  new branch starts at checkpoint "
        f"{_short(fork_config['configurable']['checkpoint_id'])} (parent "
        f"{_short(first_turn.config['configurable']['checkpoint_id'])})")
    ask(graph, fork_config, "What is my name?")
    main = graph.get_state(_config(THREAD, main_head))
    say(f"  The original timeline is untouched: it still ends with "
        f"{main.values['messages'][-1].content!r}")

    section(4, "A live schema migration of this thread (v1 -> v2)")
    say("The v2 code renames retrieved_context to context with {'text': ...} items,")
    say("upper-cases route and adds summary. Its migrations live in migrations/ "
        "(one file per step).")
    say(f"  stored now: {THREAD!r}: {_schema_versions(client, db, THREAD)}; "
        f"{BYSTANDER!r}: {_schema_versions(client, db, BYSTANDER)}")
    migrations = _load_migrations()
    saver_v2 = MongoSaver(client, db, migrations=migrations)
    graph_v2 = build_v2(saver_v2)
    main_config = _config(THREAD, main_head)
    state = graph_v2.get_state(main_config)
    say("The v2 graph reads the old thread and sees the new shape only:")
    say(f"  context = {state.values.get('context')}")
    say(f"  route = {state.values.get('route')!r}, summary = {state.values.get('summary')!r}, "
        f"retrieved_context present: {'retrieved_context' in state.values}")
    say("Continuing the original timeline with the v2 code:")
    ask(graph_v2, main_config, "And what is a migration?")
    state = graph_v2.get_state(config)
    say(f"  context now has {len(state.values['context'])} items, the newest "
        f"{state.values['context'][-1]}")
    say(f"  route = {state.values['route']!r}, summary = {state.values['summary']!r}")
    migrated = list(graph_v2.get_state_history(config))
    old_shape = sum("retrieved_context" in s.values for s in migrated)
    say(f"get_state_history through v2: {len(migrated)} checkpoints, "
        f"{old_shape} still in the old shape.")
    say(f"  stored now: {THREAD!r}: {_schema_versions(client, db, THREAD)}; "
        f"{BYSTANDER!r}: {_schema_versions(client, db, BYSTANDER)} "
        "(nobody read it, so nothing rewrote it)")

    section(5, "What an operator sees (the mongo-saver CLI)")
    env = {**os.environ, "MONGODB_URI": uri, "COLUMNS": os.environ.get("COLUMNS", "150")}
    for args in (["threads"], ["history", THREAD, "--limit", "8"]):
        say(f"$ mongo-saver --db {db} --migrations migrations {' '.join(args)}")
        shown = subprocess.run(
            [sys.executable, "-m", "mongo_saver.cli", "--db", db, "--migrations",
             str(MIGRATIONS_DIR), *args],
            env=env, capture_output=True, text=True, timeout=120,
        )
        say(shown.stdout.rstrip())
        if shown.returncode != 0:
            say(f"(the CLI failed: {shown.stderr.strip()})")


def resume(uri: str, db: str, thread: str) -> None:
    """The fresh process of section 2: a new client, a new saver, invoke(None, config)."""
    with MongoSaver.from_conn_string(uri, db) as saver:
        graph = build_v1(saver)
        config = _config(thread)
        state = graph.get_state(config)
        print(f"pid {os.getpid()}: found the thread with next = {state.next}; resuming.")
        result = graph.invoke(None, config)
        print(f"pid {os.getpid()}: assistant: {result['messages'][-1].content}")
        print(f"pid {os.getpid()}: nodes run in this process: {', '.join(NODE_LOG)} "
              "(the router and retrieve were not repeated)")


@contextmanager
def _server() -> Iterator[str]:
    uri = os.environ.get("MONGODB_URI")
    if uri:
        say("Using the MongoDB server named by MONGODB_URI.")
        yield uri
        return
    servers_py = ROOT / "scripts" / "servers.py"
    if not servers_py.exists():
        raise SystemExit("MONGODB_URI is not set and scripts/servers.py is missing; "
                         "set MONGODB_URI to a MongoDB server")
    spec = importlib.util.spec_from_file_location("mongo_saver_demo_servers", servers_py)
    assert spec is not None and spec.loader is not None
    servers: Any = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = servers
    spec.loader.exec_module(servers)
    try:
        server = servers.start_server("secantus")
    except servers.ServerError as exc:
        raise SystemExit(f"could not start the local test server: {exc}") from None
    say(f"MONGODB_URI is not set: started a local in-memory SecantusDB on "
        f"{server.host}:{server.port} for this demo.")
    try:
        yield str(server.uri)
    finally:
        server.stop()
        say("Stopped the local server.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mongo_saver.demo",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--db", default=DEMO_DB, help=f"database to use (default {DEMO_DB})")
    parser.add_argument("--resume-thread", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.resume_thread:
        uri = os.environ.get("MONGODB_URI")
        if not uri:
            raise SystemExit("--resume-thread needs MONGODB_URI")
        resume(uri, args.db, args.resume_thread)
        return 0
    say("mongo-saver demo: a small rule-based agent (no LLM, no network) checkpointed in "
        "MongoDB.")
    with _server() as uri:
        tour(uri, args.db)
    say()
    say("Done. The demo's data is in database "
        f"{args.db!r}" + (" on your server." if os.environ.get("MONGODB_URI") else "."))
    return 0


if __name__ == "__main__":
    sys.exit(main())
