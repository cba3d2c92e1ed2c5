"""Checking a YAML node tree key by key, collecting every problem with its line and key path.

Scalars read as yaml.v2 reads them into Go values (the reference's parser).
"""

from __future__ import annotations

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .errors import Problem

TAG = "tag:yaml.org,2002:"
# Used without state, for what yaml.v2 also understands: YAML 1.1 ints and bools, `<<` merges.
CONSTRUCTOR = SafeConstructor()


class NodeChecker:
    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[Problem] = []

    def add(self, where: Node | int, key: str, message: str) -> None:
        line = where if isinstance(where, int) else line_of(where)
        self.problems.append(Problem(self.file, line, key, message))

    def syntax_problem(self, exc: yaml.YAMLError) -> None:
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
            message = f"invalid YAML: {exc.problem}"
            if exc.context and exc.context_mark is not None:
                message += f" ({exc.context} at line {exc.context_mark.line + 1})"
            self.add(exc.problem_mark.line + 1, "yaml", message)
        else:
            self.add(1, "yaml", f"invalid YAML: {exc}")

    def optional_mapping(
        self, node: Node | None, path: str, allowed: tuple[str, ...], what: str
    ) -> dict[str, Node] | None:
        """`mapping` of a key that may be absent or null (then None, nothing reported)."""
        return None if node is None or is_null(node) else self.mapping(node, path, allowed, what)

    def mapping(
        self, node: Node, path: str, allowed: tuple[str, ...], what: str
    ) -> dict[str, Node] | None:
        """The values by key, after reporting non-string, unknown and repeated keys."""
        where = path or "(root)"
        if not isinstance(node, MappingNode):
            self.add(node, where, f"must be a mapping{what} (got {shown(node)})")
            return None
        try:
            CONSTRUCTOR.flatten_mapping(node)
        except yaml.YAMLError as exc:
            self.add(node, where, f"invalid merge key: {exc}")
            return None
        fields: dict[str, Node] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not (isinstance(key_node, ScalarNode) and key_node.tag == TAG + "str"):
                self.add(key_node, where, f"keys must be strings (got {shown(key_node)})")
                continue
            name, key = key_node.value, join_path(path, key_node.value)
            if name not in allowed:
                self.add(key_node, key, f"unknown key (allowed here: {', '.join(allowed)})")
            elif name in fields:
                self.add(key_node, key, f"duplicate key (first at line {first_line[name]})")
            else:
                fields[name], first_line[name] = value_node, line_of(key_node)
        return fields

    def text(self, node: Node, key: str) -> str:
        """As yaml.v2 reads a scalar into a Go string: its source text; null is ""."""
        if isinstance(node, ScalarNode):
            return "" if node.tag == TAG + "null" else str(node.value)
        self.add(node, key, f"must be a string (got {shown(node)})")
        return ""

    def required_text(
        self, fields: dict[str, Node], name: str, owner: Node, path: str
    ) -> str | None:
        key = join_path(path, name)
        node = fields.get(name)
        if node is None:
            self.add(owner, key, "required key is missing")
            return None
        text = self.text(node, key)
        if not text:
            if isinstance(node, ScalarNode):
                self.add(node, key, "must not be empty")
            return None
        return text

    def flag(self, fields: dict[str, Node], name: str, path: str) -> bool:
        node = fields.get(name)
        if node is None or is_null(node):
            return False
        if isinstance(node, ScalarNode) and node.tag == TAG + "bool":
            return bool(CONSTRUCTOR.construct_yaml_bool(node))
        self.add(node, join_path(path, name), f"must be true or false (got {shown(node)})")
        return False

    def count(
        self,
        fields: dict[str, Node],
        name: str,
        path: str,
        *,
        minimum: int,
        maximum: int | None = None,
        default: int | None = None,
    ) -> int:
        fallback = minimum if default is None else default
        node = fields.get(name)
        if node is None:
            return fallback
        value = integer(node)
        if value is None or value < minimum or (maximum is not None and value > maximum):
            bounds = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
            message = f"must be an integer {bounds} (got {shown(node)})"
            self.add(node, join_path(path, name), message)
            return fallback
        return value


def line_of(node: Node) -> int:
    return int(node.start_mark.line) + 1


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == TAG + "null"


def integer(node: Node) -> int | None:
    if isinstance(node, ScalarNode) and node.tag == TAG + "int":
        return int(CONSTRUCTOR.construct_yaml_int(node))
    return None


def shown(node: Node) -> str:
    """A bad value quoted back: scalars as written, containers by kind."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return "nothing" if is_null(node) else repr(node.value)
