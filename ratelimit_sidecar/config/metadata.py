"""A descriptor's `metadata`: a YAML mapping kept as a protobuf Struct's JSON-like values.

The reference refuses values a Struct cannot hold when it loads the file; so does this. Keys
become strings (`1: x` is "1"); numbers stay numbers.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from types import MappingProxyType

from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node


class MetadataError(ValueError):
    """Not a mapping of values a protobuf Struct can hold."""


def metadata_of(node: Node) -> Mapping[str, object]:
    if not isinstance(node, MappingNode):
        raise MetadataError("must be a mapping")
    try:
        value = SafeConstructor().construct_object(node, deep=True)
    except ConstructorError as exc:
        raise MetadataError(str(exc.problem or exc)) from None
    converted = _struct_value(value)
    assert isinstance(converted, dict)
    return MappingProxyType(converted)


def _struct_value(value: object) -> object:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(key): _struct_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_struct_value(item) for item in value]
    if isinstance(value, datetime.date):
        raise MetadataError(f"a date or time ({value}) is not a Struct value: quote it")
    raise MetadataError(f"{type(value).__name__} values are not allowed (got {value!r})")
