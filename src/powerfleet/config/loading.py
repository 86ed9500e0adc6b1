"""load_config: defaults < YAML file < POWERFLEET_* environment, each failure one ConfigError."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import ValidationError

from powerfleet.config.base import ConfigError
from powerfleet.config.model import FleetConfig

ENV_PREFIX = "POWERFLEET_"
ENV_CONFIG_FILE = "POWERFLEET_CONFIG"


def _dotted(loc: tuple[Any, ...]) -> str:
    # A key from the file may hold anything (a newline, a dot): quote it so the error stays one line.
    return ".".join(str(p) if re.fullmatch(r"[A-Za-z0-9_-]+", str(p)) else repr(str(p)) for p in loc) or "(top level)"


class _ConfigLoader(yaml.SafeLoader):
    """YAML with only true/false as booleans (the YAML 1.2 core schema). YAML 1.1 also reads
    on/off/yes/no as booleans, so a mode named `off` (budget.enforcement_evidence) arrived as
    false; pydantic still reads those words as booleans where a field is one."""


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                    list("tTfF"))


def _mapping_once(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    from powerfleet.config.overrides import construct_mapping_once  # here: queues.py imports this module

    return construct_mapping_once(loader, node)


_ConfigLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_once)


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key in (ENV_CONFIG_FILE, "POWERFLEET_INPUT_TIMEOUT_S"):  # textinput's
            continue
        path = [p.lower() for p in key[len(ENV_PREFIX):].split("__")]
        if not all(path):
            raise ConfigError(f"environment {key}: empty key segment")
        try:
            value = _load_yaml(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        except RecursionError:
            raise ConfigError(f"environment {key}: nested too deeply to parse") from None
        node = tree
        for part in path[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"environment {key}: {'.'.join(path)} conflicts with another variable")
            node = nxt
        node[path[-1]] = value
    return tree


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    from powerfleet.textinput import InputError, read_text, too_deep

    try:
        text = read_text(path)  # bounded: /dev/zero as --config is refused, not read forever
    except InputError as exc:
        if exc.reason.startswith("cannot read"):
            raise ConfigError(f"{path}: cannot read config file {exc.reason.removeprefix('cannot read it ')}") from None
        raise ConfigError(f"{path}: config file {exc.reason}") from None
    try:
        data = _load_yaml(text)
    except RecursionError:
        raise ConfigError(f"{path}: {too_deep('the YAML')}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}:{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def load_config(path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None) -> FleetConfig:
    """Build the FleetConfig. Raises ConfigError with the source and dotted key on any problem."""
    environ = os.environ if environ is None else environ
    if path is None and environ.get(ENV_CONFIG_FILE):
        path = environ[ENV_CONFIG_FILE]
    from powerfleet.config.overrides import check_file_under_overrides, env_key_of, find_nan

    file_data = _read_yaml(Path(path)) if path is not None else {}
    env_data = _env_overrides(environ)
    for tree, source in ((file_data, str(path)), (env_data, f"{ENV_PREFIX}* environment")):
        nan = find_nan(tree)
        if nan is not None:
            raise ConfigError(f"{source}: {_dotted(nan)}: .nan is not a number")
    try:
        bad = check_file_under_overrides(file_data, env_data, _deep_merge, FleetConfig.model_validate)
    except RecursionError:
        bad = None  # reported by the merged validation below
    if bad is not None:
        var = ENV_PREFIX + "__".join(str(p).upper() for p in env_key_of(env_data, bad[0]))
        raise ConfigError(f"{path}: {_dotted(bad[0])}: {bad[1]} (overridden by {var}, but the file's value is invalid)")
    try:
        return FleetConfig.model_validate(_deep_merge(file_data, env_data))
    except RecursionError:
        raise ConfigError(f"{path or 'environment'}: nested too deeply to validate") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        key = _dotted(loc)
        source = str(path) if path is not None else "defaults"
        if loc and _in_tree(env_data, loc):
            source = ENV_PREFIX + "__".join(str(p).upper() for p in loc)
        elif not loc and env_data:
            source = f"{source} + {ENV_PREFIX}* environment" if path is not None else f"{ENV_PREFIX}* environment"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        where = f"{key}: " if loc else ""  # cross-field checks name their keys in the message
        raise ConfigError(f"{source}: {where}{msg}{more}") from None


def _in_tree(tree: Mapping[str, Any], loc: tuple[Any, ...]) -> bool:
    node: Any = tree
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return False
    return True
