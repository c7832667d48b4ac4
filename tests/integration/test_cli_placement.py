"""`fleetd job submit --same-block/--topology/--mig` and `fleetd job why` against a real `fleetd
serve`: a gang's block and leaf per rank once placed, and why a gang that requires one block
waits (issue 50). The nodes' agents are played over HTTP."""

import json

import pytest

from tests.integration.test_cli import run  # noqa: F401 (the fixture)
from tests.support import wait_until
from tests.support.gpus import gpus
from tests.support.http import Http

pytestmark = pytest.mark.integration

BLOCK, LEAF = "topology.fleetd/block", "topology.fleetd/leaf"


def _nodes(server, admin, hosts):
    """A ready 2-GPU node per hostname, in the block and leaf its first letter names."""
    http = Http(server.url, admin)
    http("POST", "/api/v1/fleets", expect=201, json={"name": "gpu-a"})
    token = http("POST", "/api/v1/fleets/gpu-a/join-tokens", expect=201, json={}).json()["token"]
    for host in hosts:
        body = {
            "hostname": host,
            "machine_id": host,
            "agent_version": "0.1.0",
            "address": "127.0.0.1",
            "resources": {"cpu_count": 8, "memory_bytes": 2**35},
            "gpus": [dict(g, uuid=f"{g['uuid'][:-4]}{host:0>4}") for g in gpus(2)],
            "labels": {BLOCK: f"blk-{host[0]}", LEAF: f"leaf-{host[0]}"},
        }
        reg = http("POST", "/api/v1/agent/register", expect=201, agent_token=token, json=body)
        http("POST", "/api/v1/agent/heartbeat", expect=200, agent_token=reg.json()["session_token"])
    return http


def test_a_gang_that_must_share_a_block_and_what_job_why_says_of_it(run, server, admin):  # noqa: F811
    http = _nodes(server, admin, ["a1", "a2", "b1", "b2", "b3", "c1"])
    gang = ("--num-nodes", "3", "--gpus", "2", "--same-block", "required", "--topology")
    placed = json.loads(
        run("job", "submit", "--name", "g3", *gang, "required", "--json", "--", "true").stdout
    )
    assert placed["spec"]["network"] == {"same_block": "required"}
    assert placed["spec"]["resources"]["topology"] == "required"
    why = run("job", "why", "g3").stdout
    # Block b is the one that holds three ranks: every rank is there, and says why.
    assert [line for line in why.splitlines() if line.startswith("rank ")] and all(
        "in block blk-b, leaf leaf-b" in line
        for line in why.splitlines()
        if line.startswith("rank ")
    ), why

    # Three more ranks fit on the nodes left (a1, a2, c1) but in no one block: the gang waits,
    # naming the block that came closest.
    queued = json.loads(
        run("job", "submit", "--name", "g4", *gang[:-1], "--json", "--", "true").stdout
    )
    wait_until(
        lambda: (lambda r: r if "blk-a" in r else None)(
            http("GET", f"/api/v1/jobs/{queued['id']}", expect=200).json()["pending_reason"]
        ),
        timeout=30,
        message="the scheduler's reason for the gang",
    )
    why = run("job", "why", "g4").stdout
    assert "is queued" in why and "blk-a" in why, why
    assert "network" in why  # the filter stage of the nodes that fit a rank


def test_a_mig_profile_from_the_command_line_and_a_wrong_one(run, server, admin):  # noqa: F811
    _nodes(server, admin, ["a1"])
    job = json.loads(
        run("job", "submit", "--mig", "1g.10gb", "--gpus", "2", "--json", "--", "true").stdout
    )
    assert job["spec"]["resources"]["mig"] == "1g.10gb" and job["state"] == "queued"
    refused = run("job", "submit", "--mig", "9g.1tb", "--", "true", expect=1)
    assert "mig" in refused.stderr
