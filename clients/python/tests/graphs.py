"""A small LangGraph graph for the tests and the benchmark: three nodes that each append
a step to the state, so one run writes a handful of checkpoints and pending writes."""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph


class Steps(TypedDict):
    steps: Annotated[list[str], operator.add]


def _node(name: str):
    def run(state: Steps) -> Steps:
        return {"steps": [f"{name}:{len(state['steps'])}"]}

    return run


def build(checkpointer):
    g = StateGraph(Steps)
    for name in ("plan", "act", "reflect"):
        g.add_node(name, _node(name))
    g.add_edge(START, "plan")
    g.add_edge("plan", "act")
    g.add_edge("act", "reflect")
    g.add_edge("reflect", END)
    return g.compile(checkpointer=checkpointer)
