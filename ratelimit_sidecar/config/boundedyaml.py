"""Composing a YAML node tree while counting what walking it will cost.

Readers walk an alias as if its node were written out again, so each alias counts the whole node
it repeats: a "billion laughs" passes any limit within a few hundred nodes, refused at the alias.
A cycle (an alias inside its own node) and nesting deeper than `MAX_YAML_DEPTH` are refused too.
"""

from __future__ import annotations

import yaml
from yaml.error import Mark
from yaml.events import AliasEvent, Event, NodeEvent
from yaml.nodes import Node

from .errors import Problem
from .limits import MAX_YAML_DEPTH, LimitExceeded, Pacer, option


class LineMark(Mark):
    """A third of the memory of a `Mark`: a tree keeps one per node, and only the start is read."""

    __slots__ = ("column", "line", "name")

    def __init__(self, mark: Mark) -> None:
        self.name, self.line, self.column = mark.name, mark.line, mark.column

    def get_snippet(self, indent: int = 4, max_length: int = 75) -> str | None:  # noqa: ARG002
        return None


class BoundedLoader(yaml.SafeLoader):
    def __init__(self, data: bytes, file: str, max_nodes: int, pacer: Pacer) -> None:
        super().__init__(data)
        self._file, self._max_nodes, self._pacer = file, max_nodes, pacer
        self._count = 0  # nodes a walk of what is composed so far visits
        self._depth = 0
        self._expanded: dict[str, int] = {}  # anchor -> nodes its node stands for, once complete

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self.check_event()  # parses the next event into `current_event` without taking it
        event: NodeEvent = self.current_event
        if isinstance(event, AliasEvent):
            return self._alias(event, parent, index)
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            self._refuse(event, f"nested more than {MAX_YAML_DEPTH} levels deep")
        before = self._count
        self._add(1, event)
        node = super().compose_node(parent, index)
        self._depth -= 1
        if node is not None:
            node.start_mark, node.end_mark = LineMark(node.start_mark), None
        if event.anchor is not None:
            self._expanded[event.anchor] = self._count - before
        return node

    def _alias(self, event: NodeEvent, parent: Node | None, index: int) -> Node | None:
        anchor = event.anchor or ""
        if anchor in self.anchors and anchor not in self._expanded:
            self._refuse(event, f"alias *{anchor} is inside the node it refers to")
        # An undefined anchor is left to the composer, which reports it as a YAML error.
        self._add(self._expanded.get(anchor, 0), event)
        return super().compose_node(parent, index)

    def _add(self, nodes: int, event: Event) -> None:
        self._pacer.tick()
        self._count += nodes
        if self._count > self._max_nodes:
            what = "with aliases expanded, " if isinstance(event, AliasEvent) else ""
            self._refuse(
                event,
                f"{what}the file has more than {self._max_nodes} YAML nodes"
                f" (raise the limit with {option('max_yaml_nodes')})",
            )

    def _refuse(self, event: Event, message: str) -> None:
        line = int(event.start_mark.line) + 1 if event.start_mark is not None else 1
        raise LimitExceeded(Problem(self._file, line, "yaml", message))


def compose(data: bytes, file: str, max_nodes: int, pacer: Pacer) -> Node | None:
    """`LimitExceeded` past a bound, YAMLError if invalid."""
    loader = BoundedLoader(data, file, max_nodes, pacer)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()
