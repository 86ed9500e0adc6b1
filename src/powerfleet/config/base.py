"""What every part of the config shares: the one error, strict frozen models, Kubernetes names."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

# Kubernetes node names are DNS subdomains; queue names are built from them.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a DNS label


def is_node_name(name: str) -> bool:
    # fullmatch: "$" alone also matches before a trailing newline ("gpu-1\n" would pass).
    return _NODE_NAME.fullmatch(name) is not None


class ConfigError(Exception):
    """A config problem, already phrased as one line for the user."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
