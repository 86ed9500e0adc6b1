"""`powerfleet validate ...` commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from powerfleet.cli.errors import EXIT_FAILURE, fail, print_json, read_text_input

app = typer.Typer(help="Offline checks of inputs before they reach a cluster: `dgd-update` checks that a "
                       "DGD update leaves every power-annotated component's power inputs unchanged.",
                  no_args_is_help=True)


def _read_dgd_file(path: Path, option: str) -> Any:
    """Read one DGD from a YAML or JSON file (JSON is YAML); any problem -> exit 2."""
    text = read_text_input(path, option)
    from powerfleet.cluster.manifests import ManifestError, load_document

    try:
        doc = load_document(text)  # refuses duplicate keys, as kubectl does
    except ManifestError as exc:
        fail(f"{path} is not valid YAML or JSON: {exc}")
    except RecursionError:
        fail(f"{option}: {path} is nested too deeply to parse")
    if not isinstance(doc, dict):
        fail(f"{path} does not hold a DGD object")
    return doc


@app.command("dgd-update")
def dgd_update(
    old: Annotated[Path, typer.Option("--old", help="the DGD before the update (YAML or JSON)")],
    new: Annotated[Path, typer.Option("--new", help="the DGD after the update (YAML or JSON)")],
    json_out: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Check that an update leaves every annotated component's power inputs unchanged.

    Exit 0: allowed. Exit 1: one line per violation (path: old -> new). Exit 2: unreadable input.
    """
    from powerfleet.cluster.dgd import parse_dgd
    from powerfleet.cluster.errors import DGDInputError
    from powerfleet.cluster.immutability import validate_dgd_update

    docs = {}
    for label, path in (("old", old), ("new", new)):
        try:
            docs[label] = parse_dgd(_read_dgd_file(path, f"--{label}"))
        except DGDInputError as exc:
            fail(f"{path}: {exc}")
    violations = validate_dgd_update(docs["old"], docs["new"])
    if json_out:
        print_json({
            "version": 1,
            "allowed": not violations,
            "violations": [v.model_dump() for v in violations],
        })
    else:
        for v in violations:
            typer.echo(v.line())
    if violations:
        raise typer.Exit(EXIT_FAILURE)
