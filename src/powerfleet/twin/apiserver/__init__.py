"""A loopback Kubernetes API server: a TEST AND DEMO FIXTURE, NOT A PRODUCTION COMPONENT.

No real API server can run where powerfleet is developed and demonstrated, so this package
serves the small subset of the Kubernetes REST API that powerfleet uses, on 127.0.0.1 over
plain HTTP, so that the *official* ``kubernetes`` Python client can talk to it through a
generated kubeconfig. It has no authentication, no admission, no validation beyond what is
listed here, no garbage collection and no graceful deletion. Never expose it or point
anything real at it.

What it implements (docs/cluster.md has the full list):

* resources: core/v1 pods, nodes, events; coordination.k8s.io/v1 leases; events.k8s.io/v1
  events; nvidia.com/v1alpha1 dynamographdeployments (more via ``register``);
* GET, LIST (label selectors ``=, ==, !=, in, notin, exists, !exists``; field selectors on any
  dotted path, e.g. ``spec.nodeName``, ``metadata.name``, ``status.phase``), CREATE (incl.
  ``generateName``), UPDATE (stale ``metadata.resourceVersion`` -> 409 Conflict), PATCH
  (merge-patch; strategic-merge-patch treated as merge-patch; JSON patch when the body is a
  list), DELETE (with resourceVersion/uid preconditions), deletecollection;
* ``/status`` subresources: PUT/PATCH there change only ``status``; the main endpoint keeps
  the stored status;
* WATCH (``?watch=true``): chunked JSON lines ``{"type", "object"}``, resumable from a
  ``resourceVersion`` while it is still in the event log (else an ERROR event with 410);
* one global resourceVersion counter; ``generation`` bumps when ``spec`` changes;
* optional persistence to one JSON file (loaded at start, written atomically after every
  change and at stop) so a demo can be stopped and resumed.

Usage::

    with ApiServer() as api:
        api.write_kubeconfig(tmp / "kubeconfig")
        api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0"}})

Modules: ``server`` (ApiServer: lifecycle, kubeconfig, seeding, persistence), ``store`` (objects,
resourceVersion, event log), ``resources`` (served types), ``routing`` (paths, discovery),
``verbs`` (REST verbs), ``watch``, ``selectors``, ``patches``, ``http`` (transport), ``errors``.
"""

from powerfleet.twin.apiserver.errors import ApiError, Obj
from powerfleet.twin.apiserver.patches import json_patch, merge_patch
from powerfleet.twin.apiserver.resources import DEFAULT_RESOURCES, Registry, ResourceType
from powerfleet.twin.apiserver.selectors import parse_field_selector, parse_label_selector
from powerfleet.twin.apiserver.server import ApiServer
from powerfleet.twin.apiserver.store import Store

__all__ = [
    "DEFAULT_RESOURCES", "ApiError", "ApiServer", "Obj", "Registry", "ResourceType", "Store",
    "json_patch", "merge_patch", "parse_field_selector", "parse_label_selector",
]
