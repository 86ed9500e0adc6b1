"""The arrows docs/architecture.md draws beside the stack: the fleet and the twin never import the
tests' harness (``powerfleet.testing``), and bench scripts never import ``tests``."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_import_graph import ROOT, SRC, import_graph


# The one arrow allowed: `twin|demo --control-plane real` starts the real etcd + kube-apiserver the
# control_plane tier uses, imported inside the function that handles the option, so no other
# command (and no worker) loads the harness.
ALLOWED = {"powerfleet.cli.control_plane_opt"}


def test_nothing_in_the_fleet_or_the_twin_imports_the_test_harness() -> None:
    graph = import_graph()
    assert "powerfleet.testing.failover" in graph, "the graph did not read the tree"
    arrows = sorted(f"{name} -> {target}" for name, targets in graph.items()
                    if not name.startswith("powerfleet.testing") and name not in ALLOWED for target in targets
                    if target.startswith("powerfleet.testing"))
    assert arrows == [], arrows


def test_the_allowed_arrow_is_a_lazy_import() -> None:
    for name in ALLOWED:
        tree = ast.parse((SRC / (name.replace(".", "/") + ".py")).read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        eager = [ast.unparse(n) for n in top if "powerfleet.testing" in ast.unparse(n)]
        assert eager == [], f"{name} imports the harness at module level: {eager}"


def _top_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_bench_script_imports_the_tests() -> None:
    scripts = sorted((ROOT / "bench").rglob("*.py"))
    assert any(p.name == "failover.py" for p in scripts), "the bench folder was not read"
    offenders = [str(p.relative_to(ROOT)) for p in scripts if "tests" in _top_imports(p)]
    assert offenders == [], offenders


def test_the_import_reader_sees_a_planted_arrow(tmp_path: Path) -> None:
    planted = tmp_path / "x.py"
    planted.write_text("def f():\n    from tests.budget import explore_machine\n")
    assert "tests" in _top_imports(planted)
    assert SRC.is_dir()
