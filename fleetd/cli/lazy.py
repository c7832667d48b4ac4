"""Commands that need the [provision] extra (Fabric), imported only when they are used."""

import importlib

import click

from fleetd.cli.output import fail


def load_command(name, where):
    """The click command at `where` ("module:attr"), or one that says which extra it needs."""
    module, _, attr = where.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        absent = exc.name

    @click.command(name, help=f"(needs: pip install 'fleetd[provision]'; {absent} is missing)")
    def missing():
        fail(
            f"`fleetd {name}` needs the provision extra: pip install 'fleetd[provision]' ({absent} "
            f"is missing)"
        )

    return missing
