"""`fleetd instance|job|node COMMAND NAME` against a real `fleetd serve`: a name (a node's hostname)
stands for the one id it names in the token's view, several are listed to choose from, none is a
plain not found."""

import json

import pytest

from tests.fleetd.cli.test_cli_instances import Agent
from tests.integration.conftest import admin, data_dir, server, server_factory  # noqa: F401 - fixtures
from tests.integration.test_cli import run  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def test_instance_commands_take_a_name(run, server):  # noqa: F811
    agent = Agent(run, server.url)
    created = json.loads(
        run(
            "instance",
            "create",
            "--name",
            "web",
            "--gpus",
            "1",
            "--port",
            "8888",
            "--json",
            "--",
            "python3",
            "-m",
            "http.server",
        ).stdout
    )
    iid = created["id"]
    assignment = agent.start([(8888, 40888, "http")])
    assert assignment["instance"]["id"] == iid
    assert json.loads(run("instance", "show", "web", "--json").stdout)["id"] == iid
    assert run("instance", "connect", "web").stdout.strip() == "http://127.0.0.1:40888/"
    agent.task(assignment, "logs", lines=[["stdout", "serving on 8888"]])
    assert run("instance", "logs", "web").stdout == "serving on 8888\n"
    assert [e["to_status"] for e in json.loads(run("instance", "events", "web", "--json").stdout)][
        :3
    ] == ["pending", "starting", "running"]
    assert run("instance", "stop", "web").stdout.strip() == f"instance {iid} stopping"
    agent.task(assignment, "finish", outcome="cancelled", exit_code=143)
    proc = run("instance", "create", "--name", "web", "--", "x", expect=1)
    assert proc.stderr.startswith(
        f"fleetd: conflict: instance name 'web' is taken by instance {iid}"
    ), proc.stderr
    assert (
        run("instance", "rm", "web", "--yes")
        .stdout.strip()
        .startswith(f"deleting instance {iid}: ")
    )
    agent.call(
        "/heartbeat", {"tasks": [], "volumes": []}
    )  # its node has removed the volume: deleted
    assert run("instance", "show", iid, expect=1).stderr.startswith(
        f"fleetd: not_found: instance {iid} not found"
    )
    # Deleted, it is still found by its name while no live instance has it.
    assert (
        json.loads(run("instance", "events", "web", "--json").stdout)[-1]["to_status"] == "deleted"
    )


def test_a_name_several_instances_have_lists_them_and_an_unknown_one_is_not_found(run):  # noqa: F811
    mine = json.loads(
        run("instance", "create", "--name", "web", "--json", "--", "sleep", "1d").stdout
    )
    alice = json.loads(
        run("token", "create", "--name", "alice", "--role", "submitter", "--json").stdout
    )["token"]
    theirs = json.loads(
        run(
            "instance", "create", "--name", "web", "--json", "--", "sleep", "1d", FLEETD_TOKEN=alice
        ).stdout
    )
    # The admin sees both: it is told which there are, and to give an id.
    proc = run("instance", "stop", "web", expect=1)
    lines = proc.stderr.splitlines()
    assert (
        lines[0] == "fleetd: name 'web' names several instances; give the id of the one you mean:"
    ), proc.stderr
    assert lines[1].split() == ["ID", "OWNER", "STATE", "CREATED"]
    assert [line.split()[:3] for line in lines[2:]] == [
        [mine["id"], "admin", "pending"],
        [theirs["id"], "alice", "pending"],
    ]
    assert [i["state"] for i in json.loads(run("instance", "list", "--json").stdout)] == [
        "pending",
        "pending",
    ]
    # Alice sees only hers, so for her the name is hers.
    assert (
        run("instance", "stop", "web", FLEETD_TOKEN=alice).stdout.strip()
        == f"instance {theirs['id']} stopped"
    )
    assert [
        i["id"]
        for i in json.loads(
            run("instance", "list", "--name", "web", "--json", FLEETD_TOKEN=alice).stdout
        )
    ] == [theirs["id"]]
    proc = run("instance", "show", "nope", expect=1)
    assert proc.stderr == (
        "fleetd: not_found: instance nope not found: no instance this token may see has that name\n"
    )
    proc = run("instance", "show", mine["id"], expect=1, FLEETD_TOKEN=alice)
    assert proc.stderr.startswith(
        f"fleetd: not_found: instance {mine['id']} not found: no instance this token may "
        "see has that id or name"
    )


def test_job_and_node_commands_take_a_name_or_a_hostname(run, server):  # noqa: F811
    agent = Agent(run, server.url)
    assert json.loads(run("node", "show", "h1", "--json").stdout)["id"] == agent.node_id
    assert "cordoned node " + agent.node_id in run("node", "cordon", "h1").stdout
    assert run("node", "drain", "h1", "--reason", "bios").stdout.strip() == (
        f"draining node {agent.node_id}: now drained"
    )
    assert [
        e["to_status"]
        for e in json.loads(run("node", "events", "h1", "--json").stdout)
        if e["kind"] == "node.status"
    ] == ["ready", "cordoned", "draining", "drained"]
    proc = run("node", "show", "h2", expect=1)
    assert (
        proc.stderr
        == "fleetd: not_found: node h2 not found: no node this token may see has that hostname\n"
    )

    first = json.loads(run("job", "submit", "--name", "train", "--json", "--", "sleep", "1").stdout)
    assert json.loads(run("job", "show", "train", "--json").stdout)["id"] == first["id"]
    second = json.loads(
        run("job", "submit", "--name", "train", "--json", "--", "sleep", "1").stdout
    )
    proc = run("job", "cancel", "train", expect=1)
    assert (
        proc.stderr.splitlines()[0]
        == "fleetd: name 'train' names several jobs; give the id of the one you mean:"
    )
    assert [line.split()[0] for line in proc.stderr.splitlines()[2:]] == [first["id"], second["id"]]
    assert run("job", "cancel", second["id"]).stdout.strip() == f"job {second['id']} cancelled"
    assert [
        j["state"] for j in json.loads(run("job", "list", "--name", "train", "--json").stdout)
    ] == ["queued", "cancelled"]
