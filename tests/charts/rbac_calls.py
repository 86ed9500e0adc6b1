"""What the Kubernetes adapter (src/powerfleet/cluster/*.py) asks the API server for, read statically.

Every official-client method the adapter names is looked up in ``CLIENT_CALLS`` and becomes an
RBAC (apiGroup, resource, verb); a method passed to ``watch.Watch().stream`` is a ``watch``.
A call with ``watch=True`` is a ``watch`` too.
Custom-object calls take the group and plural from their arguments (module constants such as
``DGD_GROUP``/``DGD_PLURAL``). Adapter methods that call each other (``self.get_dgd_object`` inside
``patch_dgd_replicas``) inherit their callees' permissions.

Adding a client call to the adapter: add one line to ``CLIENT_CALLS`` (the cross-check test
names the missing method). Which adapter methods each chart role uses is ``ROLE_METHODS`` in
test_chart_rbac.py.
"""

from __future__ import annotations

import ast
import functools
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src" / "powerfleet"
ADAPTER_DIR = SRC / "cluster"

# Placeholder group/resource for custom-object calls: resolved from the call's arguments.
CUSTOM = "<custom>"
Perm = tuple[str, str, str]  # (apiGroup, resource, verb)

# official client method -> (apiGroup, resource, verb); None: a non-resource URL every
# authenticated user may read (the built-in system:discovery role), so nothing to grant.
CLIENT_CALLS: dict[str, Perm | None] = {
    # core/v1
    "read_namespaced_pod": ("", "pods", "get"),
    "list_namespaced_pod": ("", "pods", "list"),
    "list_pod_for_all_namespaces": ("", "pods", "list"),
    "patch_namespaced_pod": ("", "pods", "patch"),
    "create_namespaced_event": ("", "events", "create"),
    "patch_namespaced_event": ("", "events", "patch"),
    "list_namespaced_event": ("", "events", "list"),
    "list_node": ("", "nodes", "list"),
    "read_namespaced_config_map": ("", "configmaps", "get"),
    "create_namespaced_config_map": ("", "configmaps", "create"),
    "patch_namespaced_config_map": ("", "configmaps", "patch"),
    "read_node": ("", "nodes", "get"),
    # resource.k8s.io/v1
    "list_namespaced_resource_claim_template": ("resource.k8s.io", "resourceclaimtemplates", "list"),
    # coordination.k8s.io/v1
    "read_namespaced_lease": ("coordination.k8s.io", "leases", "get"),
    "list_namespaced_lease": ("coordination.k8s.io", "leases", "list"),
    "create_namespaced_lease": ("coordination.k8s.io", "leases", "create"),
    "replace_namespaced_lease": ("coordination.k8s.io", "leases", "update"),
    "patch_namespaced_lease": ("coordination.k8s.io", "leases", "patch"),
    "delete_namespaced_lease": ("coordination.k8s.io", "leases", "delete"),
    # custom objects (group and plural from the arguments; a subresource is appended)
    "get_namespaced_custom_object": (CUSTOM, "", "get"),
    "list_namespaced_custom_object": (CUSTOM, "", "list"),
    "list_cluster_custom_object": (CUSTOM, "", "list"),
    "create_namespaced_custom_object": (CUSTOM, "", "create"),
    "replace_namespaced_custom_object": (CUSTOM, "", "update"),
    "patch_namespaced_custom_object": (CUSTOM, "", "patch"),
    "delete_namespaced_custom_object": (CUSTOM, "", "delete"),
    "get_namespaced_custom_object_status": (CUSTOM, "/status", "get"),
    "replace_namespaced_custom_object_status": (CUSTOM, "/status", "update"),
    "patch_namespaced_custom_object_status": (CUSTOM, "/status", "patch"),
    "get_namespaced_custom_object_scale": (CUSTOM, "/scale", "get"),
    "patch_namespaced_custom_object_scale": (CUSTOM, "/scale", "patch"),
    "replace_namespaced_custom_object_scale": (CUSTOM, "/scale", "update"),
    # discovery
    "get_api_versions": None,
    "get_api_resources": None,
    "get_api_group": None,
    "get_code": None,
}

# Names that look like client calls; one that is not in CLIENT_CALLS fails the cross-check.
_CLIENT_PREFIXES = ("read_", "list_", "create_", "replace_", "patch_", "delete_", "get_", "watch_", "connect_")
_CLIENT_MARKERS = ("_namespaced_", "_for_all_namespaces", "_cluster_custom_object", "custom_object", "api_resources",
                   "api_versions")


def looks_like_client_call(name: str) -> bool:
    return name.startswith(_CLIENT_PREFIXES) and any(m in name for m in _CLIENT_MARKERS)


@dataclass(frozen=True)
class Use:
    where: str  # module.Class.method:line
    client_method: str
    perm: Perm | None


def _resolve(node: ast.expr, module: Any) -> Any:
    """A constant, or a module-level name/attribute chain, as its value (None when unknown)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return getattr(module, node.id, None)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, module)
        return getattr(base, node.attr, None) if base is not None else None
    return None


def _custom_perm(call: ast.Call | None, method: str, base: Perm, module: Any) -> Perm:
    _, sub, verb = base
    if call is None:
        raise ValueError(f"{method} is not called directly; cannot read its group and plural")
    kwargs = {k.arg: k.value for k in call.keywords if k.arg}
    cluster = "_cluster_" in method
    group_node = kwargs.get("group", call.args[0] if call.args else None)
    plural_idx = 2 if cluster else 3
    plural_node = kwargs.get("plural", call.args[plural_idx] if len(call.args) > plural_idx else None)
    group = _resolve(group_node, module) if group_node is not None else None
    plural = _resolve(plural_node, module) if plural_node is not None else None
    if not isinstance(group, str) or not isinstance(plural, str):
        raise ValueError(f"{method}: group/plural are not module constants ({ast.unparse(call)})")
    return (group, plural + sub, verb)


class _MethodScan(ast.NodeVisitor):
    def __init__(self, module: Any, where: str) -> None:
        self.module = module
        self.where = where
        self.uses: list[Use] = []
        self.unknown: list[str] = []
        self.self_calls: set[str] = set()
        self._parents: list[ast.AST] = []

    def generic_visit(self, node: ast.AST) -> None:
        self._parents.append(node)
        super().generic_visit(node)
        self._parents.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = node.attr
        parent = self._parents[-1] if self._parents else None
        if isinstance(node.value, ast.Name) and node.value.id == "self" and isinstance(parent, ast.Call) \
                and parent.func is node:
            self.self_calls.add(name)
        if name in CLIENT_CALLS:
            base = CLIENT_CALLS[name]
            call = parent if isinstance(parent, ast.Call) and parent.func is node else None
            streamed = isinstance(parent, ast.Call) and parent.func is not node and \
                isinstance(parent.func, ast.Attribute) and parent.func.attr == "stream"
            # a LIST call with watch=True streams changes: the watch verb
            streamed = streamed or (call is not None and any(
                k.arg == "watch" and isinstance(k.value, ast.Constant) and k.value.value is True for k in call.keywords))
            perm = base
            if base is not None and base[0] == CUSTOM:
                perm = _custom_perm(call, name, base, self.module)
            if perm is not None and streamed:
                perm = (perm[0], perm[1], "watch")
            self.uses.append(Use(f"{self.where}:{node.lineno}", name, perm))
        elif looks_like_client_call(name) and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
            self.unknown.append(f"{self.where}:{node.lineno}: {name}")
        self.generic_visit(node)


@dataclass
class AdapterScan:
    # "Class.method" (or "function") -> permissions, including those of the self.* methods it calls
    methods: dict[str, set[Perm]]
    uses: list[Use]
    unknown: list[str]  # client-looking calls missing from CLIENT_CALLS

    def perms_of(self, method: str) -> set[Perm]:
        found = [p for name, p in self.methods.items() if name.split(".")[-1] == method]
        if not found:
            raise KeyError(f"no adapter method {method!r} in src/powerfleet/cluster")
        return set().union(*found)

    def api_methods(self) -> set[str]:
        """Public adapter methods that reach the API server."""
        return {name.split(".")[-1] for name, perms in self.methods.items()
                if perms and not name.split(".")[-1].startswith("_")}


def scan_adapter(directory: Path = ADAPTER_DIR) -> AdapterScan:
    methods: dict[str, set[Perm]] = {}
    uses: list[Use] = []
    unknown: list[str] = []
    for path in sorted(directory.glob("*.py")):
        modname = "powerfleet.cluster." + path.stem if path.stem != "__init__" else "powerfleet.cluster"
        module = importlib.import_module(modname)
        tree = ast.parse(path.read_text(), filename=str(path))
        for top in tree.body:
            funcs: list[tuple[str, ast.AST, str | None]] = []
            if isinstance(top, ast.ClassDef):
                funcs = [(f"{top.name}.{f.name}", f, top.name) for f in top.body
                         if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
            elif isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs = [(top.name, top, None)]
            direct: dict[str, set[Perm]] = {}
            calls: dict[str, set[str]] = {}
            for qual, func, _cls in funcs:
                scan = _MethodScan(module, f"{path.stem}.{qual}")
                scan.visit(func)
                uses.extend(scan.uses)
                unknown.extend(scan.unknown)
                direct[qual] = {u.perm for u in scan.uses if u.perm is not None}
                calls[qual] = scan.self_calls
            for qual, _func, cls in funcs:
                seen, todo, perms = set(), [qual], set()
                while todo:
                    cur = todo.pop()
                    if cur in seen or cur not in direct:
                        continue
                    seen.add(cur)
                    perms |= direct[cur]
                    prefix = f"{cls}." if cls else ""
                    todo.extend(prefix + c for c in calls[cur])
                methods[f"{path.stem}.{qual}"] = perms
    return AdapterScan(methods, uses, unknown)


@functools.lru_cache(maxsize=None)
def _calls_by_attr(path: Path) -> tuple[tuple[str, int], ...]:
    """(attribute name, line) of every ``<obj>.name(...)`` call in one file (parsed once)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return tuple((node.func.attr, node.lineno) for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute))


def references(paths: list[Path], names: set[str]) -> dict[str, list[str]]:
    """Which of ``names`` are called as ``<obj>.name(...)`` in these files/directories."""
    found: dict[str, list[str]] = {}
    files: list[Path] = []
    for p in paths:
        files.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p] if p.exists() else [])
    for f in files:
        for attr, line in _calls_by_attr(f):
            if attr in names:
                found.setdefault(attr, []).append(f"{f.relative_to(SRC.parent)}:{line}")
    return found
