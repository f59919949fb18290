"""Graphs shared by the graph-level tests, importable from a fresh process.

Each node appends its name to the file named by `MS_TEST_LOG`, so a test can tell
which nodes ran in which process.
"""

from __future__ import annotations

import operator
import os
import sys
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from pymongo import MongoClient

from mongo_saver import MongoSaver


def record(node: str) -> None:
    path = os.environ.get("MS_TEST_LOG")
    if path:
        with open(path, "a") as log:
            log.write(node + "\n")


def ran(path: str) -> list[str]:
    with open(path) as log:
        return log.read().split()


class FlakyState(TypedDict):
    steps: Annotated[list[str], operator.add]


def flaky_graph(checkpointer: Any) -> Any:
    """step_1 -> step_2 -> step_3; step_2 fails while the file `MS_FAIL` exists."""

    def step_1(state: FlakyState) -> dict[str, Any]:
        record("step_1")
        return {"steps": ["step_1"]}

    def step_2(state: FlakyState) -> dict[str, Any]:
        record("step_2")
        if os.path.exists(os.environ.get("MS_FAIL", "/nonexistent")):
            raise RuntimeError("step_2 failed on purpose")
        return {"steps": ["step_2"]}

    def step_3(state: FlakyState) -> dict[str, Any]:
        record("step_3")
        return {"steps": ["step_3"]}

    builder = StateGraph(FlakyState)
    builder.add_node("step_1", step_1)
    builder.add_node("step_2", step_2)
    builder.add_node("step_3", step_3)
    builder.add_edge(START, "step_1")
    builder.add_edge("step_1", "step_2")
    builder.add_edge("step_2", "step_3")
    builder.add_edge("step_3", END)
    return builder.compile(checkpointer=checkpointer)


def resume_in_this_process(uri: str, db_name: str, thread_id: str) -> None:
    """Entry point of the child process: a fresh client, saver and graph, then resume."""
    client: MongoClient[Any] = MongoClient(uri)
    try:
        graph = flaky_graph(MongoSaver(client, db_name=db_name))
        result = graph.invoke(None, {"configurable": {"thread_id": thread_id}})
        print(result["steps"])
    finally:
        client.close()


if __name__ == "__main__":
    resume_in_this_process(*sys.argv[1:4])
