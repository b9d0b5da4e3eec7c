"""``flowmesh config show``: the effective settings (:mod:`flowmesh_sdk.settings`), each
with where it came from; secrets redacted (a secret as ***, a URL's password as ***)."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import settings
from ..errors import FlowMeshError
from .output import JSON_HELP, emit

config_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="The configuration: argument > environment > flowmesh.toml > default.")


@config_app.command("show")
def config_show(json_out: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Every setting's effective value and its source (env VAR, file PATH, default); secrets and URL passwords as ***."""
    try:
        rows = settings.effective()
    except FlowMeshError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    path = settings.config_path()
    if json_out:
        emit("config.show", file=str(path), file_exists=path.is_file(),
             settings=[{"key": r.key, "value": r.safe, "source": r.source, "secret": r.secret,
                        "redacted": r.safe != r.value} for r in rows])
        return
    table = Table(title=f"settings (file: {escape(str(path))}{'' if path.is_file() else ', absent'})")
    for col in ("key", "value", "source"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.key, escape(r.shown), escape(r.source))
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    Console().print("precedence: argument > environment variable > config file > default (docs/api.md#configuration)")


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
