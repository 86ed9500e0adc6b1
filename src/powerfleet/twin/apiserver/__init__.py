"""A loopback Kubernetes API server: a TEST AND DEMO FIXTURE, NOT A PRODUCTION COMPONENT.

No real API server can run where powerfleet is developed and demonstrated, so this package
serves the subset of the Kubernetes REST API that powerfleet uses, on 127.0.0.1 over plain
HTTP, so that the *official* ``kubernetes`` Python client can talk to it through a generated
kubeconfig. It has no authentication and no admission webhooks. Never expose it or point
anything real at it.

Where it matters to powerfleet it refuses and rewrites what a real kube-apiserver does
(``ServerOptions``; docs/cluster.md has the full list, docs/twin.md the fidelity table):

* resources: core/v1 pods, nodes, events, configmaps; coordination.k8s.io/v1 leases; events.k8s.io/v1
  events; nvidia.com DynamoGraphDeployments and their scaling adapters (more via ``register``);
* structural schemas of the custom resources (Dynamo's CRDs, ``crds/``): pruning, defaults,
  validation -> 422 naming the field, ``fieldValidation`` (Strict -> 400, Warn -> ``Warning``);
* storage in the CRD's storage version, served converted in every served version;
* metadata limits (names 253, label values 63, annotations 256 KiB -> 422), bodies over 3 MiB
  -> 413, strategic merge patch on a custom resource and server-side apply -> 415;
* graceful pod deletion (``deletionTimestamp``, the grace period, then a final delete);
* GET, LIST (label and field selectors; ``limit``/``continue`` pages from one snapshot, 410 once a
  token expired: ``pages``), CREATE (``generateName``), UPDATE (stale
  resourceVersion -> 409), PATCH (merge, JSON patch with ``test``), DELETE (preconditions),
  deletecollection, ``/status`` subresources, WATCH (resumable from the event log, else 410);
* one global resourceVersion counter; ``generation`` bumps when ``spec`` changes;
* injected faults, off by default (``faults``): a share of requests answered 429 with
  ``Retry-After`` or 5xx, and a request held until released;
* optional persistence to one JSON file (loaded at start, written atomically after every
  change and at stop) so a demo can be stopped and resumed.

Usage::

    with ApiServer() as api:
        api.write_kubeconfig(tmp / "kubeconfig")
        api.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0"}})

Modules: ``server`` (ApiServer: lifecycle, kubeconfig, seeding, persistence), ``store`` (objects,
resourceVersion, event log), ``resources`` (served types), ``routing`` (paths, discovery),
``verbs`` (REST verbs), ``pages`` (chunked LISTs), ``faults`` (injected 429/5xx, held requests), ``watch``, ``selectors``, ``patches``, ``http`` (transport), ``errors``,
``options``, ``crds`` + ``schema`` + ``admission`` (what is refused), ``conversion`` + ``versions``.
"""

from powerfleet.twin.apiserver.errors import ApiError, Obj
from powerfleet.twin.apiserver.options import ServerOptions
from powerfleet.twin.apiserver.patches import json_patch, merge_patch
from powerfleet.twin.apiserver.resources import DEFAULT_RESOURCES, Registry, ResourceType
from powerfleet.twin.apiserver.selectors import parse_field_selector, parse_label_selector
from powerfleet.twin.apiserver.server import ApiServer
from powerfleet.twin.apiserver.store import Store

__all__ = [
    "DEFAULT_RESOURCES", "ApiError", "ApiServer", "Obj", "Registry", "ResourceType", "ServerOptions", "Store",
    "json_patch", "merge_patch", "parse_field_selector", "parse_label_selector",
]
