"""A job's team comes from its submitter's token: the body may only repeat it; admins may set
any."""

import pytest

from tests.conftest import ApiClient


@pytest.fixture
def fleet(api):
    api.create_fleet("gpu-a")
    join = api.create_join_token("gpu-a")
    reg = api.register(join, machine_id="n1", hostname="n1", gpu_count=2)
    api.heartbeat(reg["session_token"])
    return reg


def _submitter(api, name, team):
    resp = api.post("/api/v1/tokens", {"name": name, "role": "submitter", "team": team})
    assert resp.status_code == 201, resp.get_json()
    return ApiClient(api.app, resp.get_json()["token"])


@pytest.mark.parametrize("other_team", ["ta", "nobody"])
def test_a_submitter_naming_another_team_is_forbidden_and_charges_nobody(api, fleet, other_team):
    _submitter(api, "alice", "ta")
    bob = _submitter(api, "bob", "tb")
    assert api.call("PUT", "/api/v1/quotas/tb", json={"max_gpus": 0}).status_code == 200
    resp = bob.post(
        "/api/v1/jobs",
        {"name": "sneaky", "command": ["true"], "resources": {"gpus": 1}, "team": other_team},
    )
    assert resp.status_code == 403, resp.get_json()
    assert resp.get_json()["error"]["code"] == "forbidden"
    assert bob.get("/api/v1/jobs").get_json()["items"] == []
    # Without a team, or repeating its own, the job is the token's team's, held by its quota.
    for body in ({}, {"team": "tb"}):
        job = bob.submit(resources={"gpus": 1}, **body)
        assert (job["team"], job["state"]) == ("tb", "queued")
        assert job["pending_reason"].startswith("team tb at its quota")
    # An admin may submit for any team.
    job = api.submit(team=other_team, resources={"gpus": 1})
    assert (job["team"], job["state"]) == (other_team, "running")


def test_simulate_schedule_takes_the_team_from_the_token_too(api, fleet):
    bob = _submitter(api, "bob", "tb")
    assert api.call("PUT", "/api/v1/quotas/tb", json={"max_gpus": 0}).status_code == 200
    spec = {"name": "probe", "command": ["true"], "resources": {"gpus": 1}}
    resp = bob.post("/api/v1/cluster/simulate-schedule", dict(spec, team="ta"))
    assert resp.status_code == 403 and resp.get_json()["error"]["code"] == "forbidden"
    verdict = bob.post("/api/v1/cluster/simulate-schedule", spec).get_json()
    assert verdict["schedulable"] is False and "team tb at its quota" in str(verdict)


def test_a_stored_spec_names_the_team_the_job_runs_as(api, fleet):
    bob = _submitter(api, "bob", "tb")
    job = bob.submit(resources={"gpus": 1})
    assert job["team"] == "tb" and job["spec"]["team"] == "tb"
