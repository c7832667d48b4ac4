"""`fleetd project`, `fleetd user` and `--project` against a real `fleetd serve`."""

import json

import pytest

from tests.integration.test_cli import run  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def test_projects_members_service_accounts_and_users_from_the_command_line(run):
    made = run("token", "create", "--name", "alice laptop", "--role", "member", "--user", "alice")
    alice = made.stdout.strip().splitlines()[-1]
    run("project", "create", "vision", "--display-name", "Vision lab", "--team", "cv")
    run("project", "add-member", "vision", "alice", "--role", "admin")
    shown = json.loads(run("project", "show", "vision", "--json").stdout)
    assert (shown["display_name"], shown["members"]) == (
        "Vision lab",
        [{"display_name": "alice", "login": "alice", "project": "vision", "role": "admin"}],
    )
    submitted = run(
        "job", "submit", "--project", "vision", "--json", "--", "true", FLEETD_TOKEN=alice
    )
    job = json.loads(submitted.stdout)
    assert (job["project"], job["team"], job["user"]) == ("vision", "cv", "alice")
    account = run("project", "service-account", "vision", "--name", "ci", FLEETD_TOKEN=alice)
    assert account.stdout.strip().splitlines()[-1].startswith("fla_")
    users = json.loads(run("user", "list", "--json").stdout)
    assert [(u["login"], u["role"], u["default_project"]) for u in users] == [
        ("alice", "member", "default")
    ]
    run("user", "update", "alice", "--default-project", "vision", "--role", "viewer")
    assert "viewer" in run("user", "show", "alice", FLEETD_TOKEN=alice).stdout
    run("user", "update", "alice", "--deactivate")
    refused = run("user", "show", "alice", FLEETD_TOKEN=alice, expect=1)
    assert "token revoked" in refused.stderr  # deactivation revoked its tokens
    assert "alice" not in run("user", "list", "--active").stdout
    listed = run("project", "list").stdout
    assert "vision" in listed and "Vision lab" in listed
