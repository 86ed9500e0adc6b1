"""The twin's read-modify-write on a real server sends a JSON merge patch (RFC 7386) of what its
mutation changed (testing/controlplane/twin_api.py): applied to the object read, it gives exactly
the mutated object, and an unchanged object gives an empty patch (no write)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from powerfleet.testing.controlplane.twin_api import merge_patch
from powerfleet.twin.apiserver.patches import merge_patch as apply_merge_patch  # RFC 7386, as the server applies it

# JSON objects without nulls (a null in a merge patch means "delete the key").
_leaf = st.one_of(st.booleans(), st.integers(-5, 5), st.text("ab", max_size=2), st.lists(st.integers(0, 3), max_size=2))
_json = st.recursive(_leaf, lambda inner: st.dictionaries(st.sampled_from("abcd"), inner, max_size=4), max_leaves=12)
_objects = st.dictionaries(st.sampled_from("abcd"), _json, max_size=4)


@settings(max_examples=300, deadline=None)
@given(_objects, _objects)
def test_the_patch_turns_the_object_read_into_the_mutated_one(old: dict[str, Any], new: dict[str, Any]) -> None:
    patch = merge_patch(old, new)
    assert apply_merge_patch(old, patch) == new, (old, new, patch)
    assert (patch == {}) == (old == new), (old, new, patch)
