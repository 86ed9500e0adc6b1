"""The structural-schema engine and the server's admission on any JSON: a clear 4xx or a stored
object, never a crash; pruning is idempotent."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerfleet.twin.apiserver.crds import crds
from powerfleet.twin.apiserver.schema import structural

_json = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**33) | st.floats(allow_nan=False) | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                         st.sampled_from(["spec", "status", "services", "components", "decode", "replicas", "name",
                                          "state", "conditions", "x"]) | st.text(max_size=5), inner, max_size=4),
                     max_leaves=30)
SCHEMAS = [(k, v, s) for k, c in crds().items() for v, s in c.schemas.items()]


@settings(max_examples=200, deadline=None)
@given(obj=_json, which=st.integers(0, len(SCHEMAS) - 1))
def test_structural_never_raises_and_pruning_is_idempotent(obj, which) -> None:
    _, _, schema = SCHEMAS[which]
    first = structural(obj, schema)
    again = structural(first.value, schema)
    assert again.unknown == [] and again.value == first.value
    assert all(isinstance(path, str) and isinstance(msg, str) for path, msg in first.errors)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=_json, status=_json, version=st.sampled_from(["v1alpha1", "v1beta1"]))
def test_any_dgd_body_gets_a_4xx_or_is_stored(api, spec, status, version) -> None:
    body = {"apiVersion": f"nvidia.com/{version}", "kind": "DynamoGraphDeployment", "metadata": {"generateName": "f-"},
            "spec": spec, "status": status}
    req = urllib.request.Request(f"{api.url}/apis/nvidia.com/{version}/namespaces/default/dynamographdeployments",
                                 method="POST", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as resp:
            assert resp.status == 201
    except urllib.error.HTTPError as exc:
        assert 400 <= exc.code < 500, exc.read()
