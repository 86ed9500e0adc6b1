"""Checks of a config's sources that the merged model cannot make (issue 29, defect 8).

- A YAML mapping that gives a key twice is refused (YAML keeps the last one without a word), as
  ``--args`` refuses a JSON key given twice.
- ``.nan`` anywhere is refused as what it is: pydantic compares it with the field's bounds and
  reports "should be less than or equal to ...", which sends a person looking for a big number.
- A value in the config file that a ``POWERFLEET_*`` variable overrides is still validated (the
  usual case after pasting the twin's export lines: the file's typo would surface only once the
  variable is gone): the file is validated with its own values where both give one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import yaml


def construct_mapping_once(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    """A SafeLoader mapping constructor that refuses a key given twice (a merge key's keys may
    still be overridden, as YAML means them to be)."""
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            again = key in seen
        except TypeError:  # unhashable: construct_mapping says so
            break
        if again:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


def find_nan(tree: Any, loc: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
    """Where a NaN lies in a parsed config tree (None: nowhere)."""
    if isinstance(tree, float) and math.isnan(tree):
        return loc
    items = tree.items() if isinstance(tree, Mapping) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        found = find_nan(v, (*loc, k))
        if found is not None:
            return found
    return None


def overridden(file_data: Mapping[str, Any], env_data: Mapping[str, Any], loc: tuple[Any, ...] = ()) -> bool:
    """Whether any leaf of ``env_data`` replaces a value the file gives."""
    for k, v in env_data.items():
        if k not in file_data:
            continue
        if isinstance(v, Mapping) and isinstance(file_data[k], Mapping):
            if overridden(file_data[k], v, (*loc, k)):
                return True
        else:
            return True
    return False


def in_both(file_data: Mapping[str, Any], env_data: Mapping[str, Any], loc: tuple[Any, ...]) -> bool:
    """Whether ``loc`` (or a key above it) is given by the file and replaced by the environment."""
    f, e = file_data, env_data
    for part in loc:
        if not (isinstance(f, Mapping) and isinstance(e, Mapping) and part in f and part in e):
            return False
        f, e = f[part], e[part]
        if not isinstance(e, Mapping) or not isinstance(f, Mapping):
            return True
    return True


def env_key_of(env_data: Mapping[str, Any], loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The part of ``loc`` the environment variable that replaces it names."""
    node: Any = env_data
    for i, part in enumerate(loc):
        if not isinstance(node, Mapping) or part not in node:
            return loc[:i]
        node = node[part]
        if not isinstance(node, Mapping):
            return loc[:i + 1]
    return loc


def check_file_under_overrides(file_data: dict[str, Any], env_data: dict[str, Any],
                               merge: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
                               validate: Callable[[dict[str, Any]], Any]) -> tuple[tuple[Any, ...], str] | None:
    """(loc, message) of a file value that is invalid although the environment overrides it, or None.

    The file is validated with its own values where both sources give one (the environment's
    elsewhere, so a file completed by variables is judged as a whole); only an error at a value
    the environment replaces is reported here: any other surfaces in the merged validation."""
    from pydantic import ValidationError

    if not overridden(file_data, env_data):
        return None
    try:
        validate(merge(env_data, file_data))
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(err["loc"])
            if loc and in_both(file_data, env_data, loc):
                return loc, err["msg"]
    return None
