"""bench/mutants.py itself: a mutant that no longer applies stops the run, and the copy it
plants mutants in is the code the tests import (never the working tree)."""

from pathlib import Path

import pytest

mutants = pytest.importorskip("bench.mutants")  # the image copies tests/ but not bench/
Mutant = mutants.Mutant
CheckError = mutants.CheckError

SOURCE = "def cap(w):\n    return min(w, 700)\n"


def mutant(original: str, replacement: str) -> "Mutant":
    return Mutant("t.m", "src/x.py", original, replacement, ("tests/t.py",), "a bug")


def test_a_mutant_is_planted_only_where_its_snippet_is_found_exactly_once() -> None:
    assert mutants.mutated_text(mutant("min(w, 700)", "max(w, 700)"), SOURCE) == SOURCE.replace("min", "max")
    with pytest.raises(CheckError, match="t.m: the snippet to replace occurs 0 times in src/x.py"):
        mutants.mutated_text(mutant("min(w, 800)", "w"), SOURCE)
    with pytest.raises(CheckError, match="occurs 2 times"):
        mutants.mutated_text(mutant("700", "800"), SOURCE + "LIMIT = 700\n")
    with pytest.raises(CheckError, match="does not compile"):
        mutants.mutated_text(mutant("return min(w, 700)", "return min(w,"), SOURCE)


def test_only_selects_by_name_or_pattern_and_refuses_unknown_names() -> None:
    names = [m.name for m in mutants.MUTANTS]
    assert len(set(names)) == len(names)
    assert [m.name for m in mutants.select(["s?.*"])] == [n for n in names if n[0] == "s" and n[2] == "."]
    # The eight survivors of issue 24; survivor 1 has two (agent once's lister, the worker's pod view).
    survivors = mutants.select(["s?.*"])
    assert len(survivors) == 9 and {m.name.split(".")[0] for m in survivors} == {f"s{i}" for i in range(1, 9)}
    with pytest.raises(CheckError, match="no mutant matches nope"):
        mutants.select(["nope"])


def test_the_tests_import_the_copy_not_the_working_tree(tmp_path: Path) -> None:
    tree = mutants.make_copy(tmp_path)
    assert (tree / "src" / "powerfleet" / "queues.py").is_file() and not (tree / "src").is_symlink()
    assert (tree / "docs").is_symlink()
    mutants.check_copy_is_imported(tree)  # raises CheckError otherwise


def test_a_mutant_runs_in_the_copy_is_killed_and_leaves_both_trees_as_they_were(tmp_path: Path) -> None:
    m = Mutant("t.node_queue", "src/powerfleet/queues.py", 'return f"{NODE_QUEUE_PREFIX}{node}"', "return node",
               ("tests/unit/test_tasks_and_routes.py::test_routes",), "node tasks go to a queue named like the node")
    real = mutants.ROOT / m.file
    before = real.read_bytes()
    tree = mutants.make_copy(tmp_path)
    outcome = mutants.run_mutant(tree, m, timeout_s=120)
    assert outcome.status == "killed", outcome
    assert outcome.caught_by and outcome.caught_by.startswith("tests/unit/test_tasks_and_routes.py::test_routes")
    assert real.read_bytes() == before and (tree / m.file).read_bytes() == before
