"""Typed errors for bad deployment input. Every one names the component and the field path."""

from __future__ import annotations


class DGDInputError(ValueError):
    """A DynamoGraphDeployment that powerfleet cannot use.

    ``path`` is the exact field path (e.g.
    ``spec.components[name=decode].podTemplate.metadata.annotations[dynamo.nvidia.com/gpu-power-limit]``),
    ``component`` the component name ("" when the problem is deployment-wide).
    """

    def __init__(self, path: str, message: str, *, component: str = "") -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message
        self.component = component


class DGDFormatError(DGDInputError):
    """The DGD does not have the shape powerfleet reads (missing name, unknown type, ...)."""


class PowerInputError(DGDInputError):
    """A power input (cap annotation, GPUs per pod, nodeCount, role layout) is missing or invalid."""
