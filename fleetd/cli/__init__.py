"""The `fleetd` command line: local admin commands (init, serve, db) and REST client commands.

Its modules follow fleetd/api/ (admin, tokens, fleets, nodes, jobs, instances, cluster); each lists
its top-level commands in COMMANDS, and the root group `cli` here takes them all. The shared parts:
output.py (what is printed), params.py (option values), remote.py (the REST client of a command).
`bootstrap` and `bundle` (fleetd/provision/cli.py) are loaded only when used.
"""

import click

from fleetd.cli import (
    admin,
    cluster,
    fleets,
    instances,
    jobs,
    nodes,
    notifications,
    people,
    rollouts,
    tokens,
    usage,
    validation,
    webhooks,
)
from fleetd.cli.lazy import load_command


class LazyGroup(click.Group):
    """Operator commands that need the [provision] extra (Fabric) are imported only when used."""

    lazy = {"bootstrap": "fleetd.provision.cli:bootstrap", "bundle": "fleetd.provision.cli:bundle"}

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx, name):
        if name not in self.lazy:
            return super().get_command(ctx, name)
        return load_command(name, self.lazy[name])


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="fleetd", prog_name="fleetd")
def cli():
    """fleetd: manage a fleet of GPU servers."""


def _add_commands():
    for module in (
        admin,
        tokens,
        fleets,
        nodes,
        jobs,
        instances,
        cluster,
        rollouts,
        webhooks,
        usage,
        validation,
        people,
        notifications,
    ):
        for command in module.COMMANDS:
            cli.add_command(command)


_add_commands()
