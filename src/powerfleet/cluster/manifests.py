"""Reading DGD manifests from YAML (or JSON) text, strictly.

A YAML mapping with a duplicate key is refused, as kubectl refuses it: PyYAML would keep
the last value silently, so a changed power annotation could hide behind its twin.
Multi-document files (a ResourceClaimTemplate, a ConfigMap and a DGD, say) are read whole;
``dgd_documents`` keeps the DynamoGraphDeployments.
"""

from __future__ import annotations

from typing import Any

import yaml

from powerfleet.cluster.dgd import DGD_GROUP, DGD_KIND


class ManifestError(ValueError):
    """Unreadable manifest text; the message is one line naming where."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key; let the base constructor report it
            duplicate = False
        if duplicate:
            first = seen[key].start_mark
            raise ManifestError(
                f"line {key_node.start_mark.line + 1}: duplicate key {key!r} "
                f"(first at line {first.line + 1}); a mapping may not repeat a key"
            )
        seen[key] = key_node
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_documents(text: str) -> list[Any]:
    """Every document in ``text`` (empty ones dropped). Raises ManifestError."""
    try:
        return [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise ManifestError(f"{where}{getattr(exc, 'problem', None) or 'invalid YAML'}") from None


def load_document(text: str) -> Any:
    """Exactly one document. Raises ManifestError."""
    docs = load_documents(text)
    if len(docs) != 1:
        raise ManifestError(f"expected one document, found {len(docs)}")
    return docs[0]


def is_dgd(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and doc.get("kind") == DGD_KIND
        and str(doc.get("apiVersion", "")).startswith(f"{DGD_GROUP}/")
    )


def dgd_documents(text: str) -> list[dict[str, Any]]:
    """The DynamoGraphDeployment documents of a (multi-document) manifest."""
    return [d for d in load_documents(text) if is_dgd(d)]
