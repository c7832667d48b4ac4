"""Every command of `fleetd` and `fleet-agent` explains itself: a help text, help on each option,
and `-h`."""

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from agent.cli import cli as agent_cli
from fleetd.cli import cli as fleetd_cli

# Commands whose options are documented in a module this test does not own
# (fleetd/provision/cli.py): they still must have a help text and answer -h; their options are
# checked by the provision tests' owners.
FOREIGN = {("fleetd", "bootstrap"), ("fleetd", "bundle")}


def walk(group, path):
    """(path, command) for the group and every command under it."""
    yield path, group
    if isinstance(group, click.Group):
        ctx = click.Context(group, info_name=path[-1])
        for name in group.list_commands(ctx):
            yield from walk(group.get_command(ctx, name), path + (name,))


COMMANDS = list(walk(fleetd_cli, ("fleetd",))) + list(walk(agent_cli, ("fleet-agent",)))
IDS = [" ".join(path) for path, _ in COMMANDS]


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_every_command_has_a_help_text_and_answers_dash_h(path, command):
    assert (command.help or "").strip(), f"{' '.join(path)} has no help text"
    root = fleetd_cli if path[0] == "fleetd" else agent_cli
    result = CliRunner().invoke(root, [*path[1:], "-h"], prog_name=path[0])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: {' '.join(path)}"), result.output


@pytest.mark.parametrize(
    ("path", "command"),
    [(p, c) for p, c in COMMANDS if p[:2] not in FOREIGN],
    ids=[i for (p, _), i in zip(COMMANDS, IDS) if p[:2] not in FOREIGN],
)
def test_every_option_has_a_help_text(path, command):
    bare = [
        p.opts[0]
        for p in command.params
        if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()
    ]
    assert bare == [], f"{' '.join(path)}: options without help: {bare}"


def test_the_walk_reaches_the_commands_of_the_issue():
    # The walk itself could silently find nothing; these were the ones reported without help.
    paths = {p for p, _ in COMMANDS}
    assert {
        ("fleetd", "node", name) for name in ("cordon", "uncordon", "revoke", "undrain")
    } <= paths
    assert ("fleet-agent", "status") in paths


def test_retries_help_gives_its_default():
    result = CliRunner().invoke(fleetd_cli, ["job", "submit", "-h"], prog_name="fleetd")
    retries = result.output[result.output.index("--retries") :].split("\n  -")[0]
    assert "default: 2" in " ".join(retries.split())


@pytest.mark.integration  # real processes
@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "agent", "-h"],
        ["-m", "agent", "status", "-h"],
        ["-m", "fleetd", "node", "cordon", "-h"],
    ],
)
def test_dash_h_works_in_a_real_process(argv):
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: "), proc.stdout
