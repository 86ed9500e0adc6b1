"""A scenario's own DynamoGraphDeployments (``deployments.<name>.manifest`` inline, or
``manifest_file`` by path; docs/twin.md "Deployments from manifests"), checked as the cluster and
the fleet would check them before anything starts (pure but for reading the file):

* the file: a regular file of at most 1 MiB, YAML (a key given twice refused, as kubectl does),
  exactly one DynamoGraphDeployment among its documents;
* the custom resource's structural schema (the twin's copy of Dynamo's CRD, twin/apiserver/crds/):
  types, enums, bounds, required fields; a field the schema would prune is refused here (a real
  server would prune it silently, and the scenario would not run what was written); the levels the
  reduced schema keeps unlisted (``x-twin-unlisted: keep``) are kept as written, unchecked;
* the fleet's own reading (cluster/dgd.py ``parse_dgd``, cluster/power.py ``resolve_power_config``):
  one worker-like component, or a prefill/decode pair, each with GPUs and a power annotation;
* what the twin needs to serve it: a ``frontend`` component (the traffic enters there).

Every error is one line naming its key path under the deployment (``manifest.spec.services.decode
.replicas: Invalid value: -1: ...``). ``check_manifest`` returns the role -> component map
(twin/cluster/roles.py) the scenario's events (``propose``, ``set_annotation``) and the twin's power
and traffic models use, so a component may be named as the operator likes (``VllmDecodeWorker``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from powerfleet.cluster.dgd import DGD_GROUP, DGD_KIND, ComponentType
from powerfleet.twin.cluster.roles import roles

DGD_PLURAL = "dynamographdeployments"
FRONTEND = ComponentType.FRONTEND.value


def read_manifest(path: Path) -> dict[str, Any]:
    """The one DynamoGraphDeployment in the file at ``path``; raises ValueError (one line)."""
    from powerfleet.cluster.manifests import ManifestError, is_dgd, load_documents
    from powerfleet.twin.demo.scenario_files import MAX_DEPTH, _depth, read_bounded

    text = read_bounded(path, "manifest_file")
    try:
        docs = load_documents(text)
    except ManifestError as exc:
        raise ValueError(f"manifest_file {path}: {exc}") from None
    except RecursionError:
        raise ValueError(f"manifest_file {path}: nested too deeply") from None
    if any(_depth(d) > MAX_DEPTH for d in docs):
        raise ValueError(f"manifest_file {path}: nested deeper than {MAX_DEPTH} levels")
    dgds = [d for d in docs if is_dgd(d)]
    if len(dgds) != 1:
        kinds = ", ".join(str(d.get("kind")) if isinstance(d, Mapping) else type(d).__name__ for d in docs) or "none"
        raise ValueError(f"manifest_file {path}: {len(dgds)} DynamoGraphDeployments (documents: {kinds}); "
                         "give exactly one")
    return dgds[0]


def check_manifest(obj: Any, name: str | None = None) -> dict[str, str]:
    """Validate a DGD manifest (for the deployment ``name``, when given); returns its roles (``roles``)."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"manifest: a DynamoGraphDeployment is a mapping, got {type(obj).__name__}")
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    crd = _crd()
    served = [f"{DGD_GROUP}/{v}" for v in crd.versions]
    if kind != DGD_KIND or api_version not in served:
        raise ValueError(f"manifest: apiVersion/kind {api_version}/{kind} is not a DynamoGraphDeployment "
                         f"({' or '.join(served)})")
    meta = obj.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise ValueError("manifest.metadata: must be a mapping")
    if name is not None and meta.get("name") not in (None, name):
        raise ValueError(f"manifest.metadata.name: {meta.get('name')!r} is not the deployment's key {name!r} "
                         "(leave it out or give the same name)")
    from powerfleet.twin.apiserver.schema import structural

    result = structural({k: v for k, v in obj.items() if k != "status"}, crd.schemas[str(api_version).split("/")[1]])
    if result.unknown:
        more = f" (and {len(result.unknown) - 1} more)" if len(result.unknown) > 1 else ""
        raise ValueError(f"manifest.{result.unknown[0]}: unknown field: the DynamoGraphDeployment schema does not "
                         f"declare it{more}")
    if result.errors:
        path, msg = result.errors[0]
        more = f" (and {len(result.errors) - 1} more)" if len(result.errors) > 1 else ""
        raise ValueError(f"manifest.{path}: {msg}{more}")
    out = roles({**obj, "metadata": {**meta, "name": name or meta.get("name") or "manifest"}})
    if FRONTEND not in out:
        raise ValueError("manifest.spec: no frontend component (componentType: frontend): the twin's traffic "
                         "enters a deployment through its frontend")
    return out


def _crd() -> Any:
    from powerfleet.twin.apiserver.crds import crds

    return crds()[(DGD_GROUP, DGD_PLURAL)]
