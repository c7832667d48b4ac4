"""Rollouts in fleetd (the plan, the policy that pauses, the requests any CLI makes) and the
webhooks of a node's lifecycle (enrolled, drained with why, upgraded, revoked, deleted), in
process."""

import datetime as dt
import json
import types
import urllib.parse

import pytest

from fleetd.db import database
from fleetd.models import WebhookDelivery

SHA = "ab" * 32


def _nodes(api, count, token):
    """`count` ready nodes gpu-1.. of fleet gpu-a; returns their ids by hostname."""
    return {f"gpu-{i}": api.ready_node(token, f"gpu-{i}")[0] for i in range(1, count + 1)}


def _start(api, expect=201, **body):
    body = dict({"fleet": "gpu-a", "bundle_version": "0.2.0", "bundle_sha256": SHA}, **body)
    resp = api.post("/api/v1/rollouts", body)
    assert resp.status_code == expect, resp.get_json()
    return resp.get_json()


def _report(api, rollout, node_id, state, expect=200, detail=""):
    resp = api.patch(
        f"/api/v1/rollouts/{rollout['id']}/nodes/{node_id}", {"state": state, "detail": detail}
    )
    assert resp.status_code == expect, resp.get_json()
    return resp.get_json()


def _deliveries():
    with database.connection_context():
        return [
            (d.kind, json.loads(d.body))
            for d in WebhookDelivery.select().order_by(WebhookDelivery.at)
        ]


def test_a_failed_canary_pauses_the_rollout_before_other_nodes_resume_and_abort_come_from_anywhere(
    api,
):
    api.create_fleet("gpu-a")
    token = api.create_join_token("gpu-a", max_uses=10)
    ids = _nodes(api, 4, token)
    # An operator cordoned gpu-1: the canary is a node in service; gpu-4's agent is silent
    # (pending).
    api.post(f"/api/v1/nodes/{ids['gpu-1']}/cordon")
    api.register(token, machine_id="gpu-5", hostname="gpu-5")
    assert (
        api.post(
            "/api/v1/webhooks",
            {
                "url": "https://hooks.example.com/x",
                "secret": "0123456789abcdef",
                "events": ["rollout.node", "rollout.state"],
            },
        ).status_code
        == 201
    )

    rollout = _start(api, batch="50%", canary=1, max_failures=0)
    plan = [(n["hostname"], n["batch"], n["canary"], n["state"]) for n in rollout["nodes"]]
    assert plan == [
        ("gpu-2", 0, True, "pending"),
        ("gpu-1", 1, False, "pending"),
        ("gpu-3", 1, False, "pending"),
        ("gpu-4", 2, False, "pending"),
        ("gpu-5", 3, False, "skipped"),
    ], plan
    assert rollout["state"] == "running" and rollout["batch"] == "50%" and rollout["canary"] == 1
    # One active rollout per fleet.
    assert "abort it or let it finish" in _start(api, expect=409)["error"]["message"]

    # Nothing after the canary begins while it is under way; its failure pauses the rollout.
    _report(api, rollout, ids["gpu-2"], "upgrading")
    assert (
        "canaries are not through"
        in _report(api, rollout, ids["gpu-3"], "upgrading", 409)["error"]["message"]
    )
    paused = _report(api, rollout, ids["gpu-2"], "failed", detail="the agent did not start")
    assert paused["state"] == "paused", paused
    assert paused["state_reason"].startswith(
        f"paused by fleetd: canary node {ids['gpu-2']} failed (the agent"
    )
    refused = _report(api, rollout, ids["gpu-3"], "upgrading", 409)
    assert "is paused" in refused["error"]["message"]
    assert [n["state"] for n in paused["nodes"]][1:] == ["pending", "pending", "pending", "skipped"]
    kinds = [(k, b["data"]["to_status"]) for k, b in _deliveries()]
    assert ("rollout.node", "failed") in kinds and ("rollout.state", "paused") in kinds, kinds
    events = api.get(f"/api/v1/nodes/{ids['gpu-2']}/events").get_json()["items"]
    assert any(
        e["kind"] == "rollout.node" and "canary failed: the agent did not start" in e["reason"]
        for e in events
    )

    # An operator resumes (accepting the canary's failure); one more failure exceeds --max-failures
    # 0.
    assert api.post(f"/api/v1/rollouts/{rollout['id']}/resume").get_json()["state"] == "running"
    _report(api, rollout, ids["gpu-1"], "upgrading")
    _report(api, rollout, ids["gpu-1"], "done", detail="upgraded")
    _report(api, rollout, ids["gpu-3"], "upgrading")
    again = _report(api, rollout, ids["gpu-3"], "failed", detail="boom")
    assert (
        again["state"] == "paused"
        and "2 node(s) failed, more than --max-failures 0" in again["state_reason"]
    )
    assert _report(api, rollout, ids["gpu-3"], "done", 409)["error"]["code"] == "conflict"

    # Abort: the nodes that never began are skipped, and say why; the rollout is over.
    aborted = api.post(f"/api/v1/rollouts/{rollout['id']}/abort").get_json()
    assert aborted["state"] == "aborted"
    gpu4 = next(n for n in aborted["nodes"] if n["hostname"] == "gpu-4")
    assert gpu4["state"] == "skipped" and gpu4["detail"].startswith(
        "not upgraded: the rollout was aborted by token:"
    )
    assert api.post(f"/api/v1/rollouts/{rollout['id']}/resume").status_code == 409
    listed = api.get("/api/v1/rollouts?fleet=gpu-a").get_json()["items"]
    assert [r["id"] for r in listed] == [rollout["id"]]
    # A new rollout may start once the last one ended.
    assert _start(api)["state"] == "running"


def test_a_rollout_with_no_node_left_to_try_ends_failed_and_a_paused_one_retries_its_failures(
    api,
):
    api.create_fleet("gpu-a")
    ids = _nodes(api, 3, api.create_join_token("gpu-a", max_uses=10))
    rollout = _start(api, batch=1, canary=1, max_failures=0)
    canary = next(n["node_id"] for n in rollout["nodes"] if n["canary"])
    _report(api, rollout, canary, "upgrading")
    paused = _report(api, rollout, canary, "failed", detail="agent did not start")
    assert paused["state"] == "paused"
    action = f"/api/v1/rollouts/{rollout['id']}/retry"
    retried = api.post(action).get_json()
    assert retried["state"] == "running" and "retry of 1 failed node(s)" in retried["state_reason"]
    assert next(n for n in retried["nodes"] if n["canary"])["state"] == "pending"
    assert api.post(action).status_code == 409  # running: nothing to retry
    _report(api, rollout, canary, "upgrading")
    _report(api, rollout, canary, "done")
    others = [n for n in ids.values() if n != canary]
    _report(api, rollout, others[0], "upgrading")
    _report(api, rollout, others[0], "done")
    _report(api, rollout, others[1], "upgrading")
    # The last node fails over --max-failures 0: nothing is left to resume, so it ends failed.
    ended = _report(api, rollout, others[1], "failed", detail="pip: no space left on device")
    assert ended["state"] == "failed" and ended["state_reason"].startswith("failed: 1 node(s)")
    assert "no node left to try" in ended["state_reason"]
    assert api.post(action).status_code == 409  # ended: a new rollout takes the node
    assert _start(api)["state"] == "running"  # an ended rollout leaves the fleet free


def test_a_rollout_ends_done_when_its_last_node_is_through_and_bad_input_is_refused(api):
    api.create_fleet("gpu-a")
    ids = _nodes(api, 2, api.create_join_token("gpu-a", max_uses=10))
    for body, field in (
        ({"batch": "0%"}, "batch"),
        ({"batch": 0}, "batch"),
        ({"batch": True}, "batch"),
        ({"bundle_sha256": "xyz"}, "bundle_sha256"),
        ({"canary": -1}, "canary"),
        ({"window": {"windows": []}}, "window"),
    ):
        resp = api.post(
            "/api/v1/rollouts",
            dict({"fleet": "gpu-a", "bundle_version": "1", "bundle_sha256": SHA}, **body),
        )
        assert resp.status_code == 400 and field in json.dumps(resp.get_json()["error"]), (
            body,
            resp.get_json(),
        )
    assert _start(api, expect=404, fleet="nope")["error"]["code"] == "not_found"
    rollout = _start(api, canary=0, batch=2)
    assert [n["batch"] for n in rollout["nodes"]] == [1, 1]
    assert _report(api, rollout, "nope", "upgrading", 404)["error"]["code"] == "not_found"
    for node_id in ids.values():
        _report(api, rollout, node_id, "upgrading")
    _report(api, rollout, ids["gpu-1"], "done")
    done = _report(api, rollout, ids["gpu-2"], "done")
    assert done["state"] == "done" and done["state_reason"] == "2 done", done
    assert api.post(f"/api/v1/rollouts/{rollout['id']}/pause").status_code == 409


def test_node_lifecycle_webhooks_say_enrolled_drained_why_upgraded_revoked_and_deleted(api):
    api.create_fleet("gpu-a")
    assert (
        api.post(
            "/api/v1/webhooks",
            {
                "url": "https://hooks.example.com/x",
                "secret": "0123456789abcdef",
                "events": [
                    "node.enrolled",
                    "node.drained",
                    "node.upgraded",
                    "node.revoked",
                    "node.deleted",
                ],
            },
        ).status_code
        == 201
    )
    token = api.create_join_token("gpu-a", max_uses=10)
    node_id, _ = api.ready_node(token, "gpu-1")
    api.post(f"/api/v1/nodes/{node_id}/cordon")
    assert (
        api.post(
            f"/api/v1/nodes/{node_id}/upgrade", {"reason": "to 0.2.0", "deadline_seconds": 60}
        ).status_code
        == 200
    )
    assert (
        api.post(
            f"/api/v1/nodes/{node_id}/upgrade/end", {"outcome": "succeeded", "detail": "0.2.0"}
        ).get_json()["status"]
        == "cordoned"
    )
    api.post(f"/api/v1/nodes/{node_id}/uncordon")
    api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "RMA pending", "deadline_seconds": 60})
    api.post(f"/api/v1/nodes/{node_id}/revoke")
    assert api.delete(f"/api/v1/nodes/{node_id}").status_code == 204
    got = _deliveries()
    assert [k for k, _ in got] == [
        "node.enrolled",
        "node.drained",
        "node.upgraded",
        "node.drained",
        "node.revoked",
        "node.deleted",
    ], got
    upgrade_drained, upgraded, drained = got[1][1]["data"], got[2][1]["data"], got[3][1]["data"]
    assert upgrade_drained["drain_reason"] == "to 0.2.0"
    assert upgraded["outcome"] == "succeeded" and upgraded["status"] == "cordoned"
    assert (
        "upgrade done (to 0.2.0): 0.2.0; the node is cordoned again" == got[2][1]["data"]["reason"]
    )
    assert drained["drain_reason"] == "RMA pending"
    # Every node webhook names the host and its fleet, the deleted node's too.
    assert all((d["data"]["hostname"], d["data"]["fleet"]) == ("gpu-1", "gpu-a") for _, d in got), (
        got
    )
    # The upgrade's events name the upgrade, never an operator's undrain or cordon.
    reasons = [
        e["reason"]
        for e in api.get(f"/api/v1/nodes/{node_id}/events").get_json()["items"]
        if e["kind"] == "node.status"
    ]
    assert reasons[2:5] == [
        "upgrade: to 0.2.0",
        "drain complete: no running tasks",
        "upgrade done (to 0.2.0): 0.2.0; cordoned as before (cordoned by admin)",
    ], reasons


def test_reasons_never_nest_over_upgrades_of_a_cordoned_node(api):
    api.create_fleet("gpu-a")
    node_id, _ = api.ready_node(api.create_join_token("gpu-a"), "gpu-1")
    api.post(f"/api/v1/nodes/{node_id}/cordon", {"reason": "fan noise"})
    for version in ("0.2.0", "0.3.0", "0.4.0"):
        api.post(f"/api/v1/nodes/{node_id}/upgrade", {"reason": f"to {version}"})
        ended = api.post(
            f"/api/v1/nodes/{node_id}/upgrade/end", {"outcome": "succeeded", "detail": version}
        ).get_json()
        assert ended["status"] == "cordoned"
        assert ended["status_reason"] == (
            f"upgrade done (to {version}): {version}; cordoned as before (cordon: fan noise)"
        ), ended["status_reason"]


def test_a_retried_upgrade_is_accepted_on_a_node_gone_lost_after_its_failed_upgrade(api, clock):
    # The agent of a failed upgrade is down: the node may be declared lost between the retry reading
    # it (drained) and beginning. fleetd accepts the retry on the record it holds; the node stays
    # lost until the new agent heartbeats, then it is drained for the upgrade and put back as it
    # was.
    api.create_fleet("gpu-a")
    token = api.create_join_token("gpu-a", max_uses=10)
    node_id, session = api.ready_node(token, "gpu-1")
    lost_id, _ = api.ready_node(token, "gpu-2")
    api.post(f"/api/v1/nodes/{node_id}/upgrade", {"reason": "to 0.2.0", "deadline_seconds": 60})
    failed = api.post(
        f"/api/v1/nodes/{node_id}/upgrade/end", {"outcome": "failed", "detail": "agent died"}
    ).get_json()
    assert failed["status"] == "drained" and failed["upgrade"]["failed"], failed
    clock.advance(3600)
    api.run_task("liveness_sweep")
    assert api.node(node_id)["status"] == "lost" and api.node(lost_id)["status"] == "lost"
    # A rollout after the failed one takes the node again; a node lost for no upgrade is skipped.
    rollout = _start(api, canary=0)
    assert {n["node_id"]: n["state"] for n in rollout["nodes"]} == {
        node_id: "pending",
        lost_id: "skipped",
    }
    api.post(f"/api/v1/rollouts/{rollout['id']}/abort")

    again = api.post(
        f"/api/v1/nodes/{node_id}/upgrade", {"reason": "to 0.2.1", "deadline_seconds": 60}
    )
    assert again.status_code == 200, again.get_json()
    assert again.get_json()["status"] == "lost" and not again.get_json()["upgrade"]["failed"], (
        again.get_json()
    )
    reasons = [e["reason"] for e in api.get(f"/api/v1/nodes/{node_id}/events").get_json()["items"]]
    assert (
        "upgrade: to 0.2.1; the node stays lost until its new agent's heartbeat (it went silent "
        "after the upgrade that failed)" in reasons
    ), reasons
    # A lost node that no upgrade left out of service is not upgraded through fleetd.
    refused = api.post(
        f"/api/v1/nodes/{lost_id}/upgrade", {"reason": "to 0.2.1", "deadline_seconds": 60}
    )
    assert refused.status_code == 409 and refused.get_json()["error"]["details"]["status"] == "lost"

    api.heartbeat(session)  # the new agent
    assert api.node(node_id)["status"] == "drained"
    done = api.post(
        f"/api/v1/nodes/{node_id}/upgrade/end", {"outcome": "succeeded", "detail": "0.2.1"}
    ).get_json()
    assert done["status"] == "ready" and done["upgrade"] is None, done


def test_a_deleted_hosts_node_comes_back_under_its_old_id_with_its_history(api):
    # What Terraform's -replace does to a host: `fleetd bootstrap --remove` deletes its node, then
    # the same host enrols again with a new join token.
    api.create_fleet("gpu-a")
    node_id, _ = api.ready_node(api.create_join_token("gpu-a"), "gpu-1")
    api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "replacing", "deadline_seconds": 60})
    assert api.delete(f"/api/v1/nodes/{node_id}").status_code == 204
    again = api.register(api.create_join_token("gpu-a"), machine_id="gpu-1", hostname="gpu-1")
    assert again["node_id"] == node_id
    events = api.get(f"/api/v1/nodes/{node_id}/events").get_json()["items"]
    kinds = [e["kind"] for e in events]
    assert kinds.index("node.deleted") < len(kinds) - 1 and kinds[0] == "node.registered", kinds
    back = [e["reason"] for e in events if e["kind"] == "node.registered"][-1]
    assert "again, under the id its host had until its node was deleted" in back, back
    # Another host never gets that id; a second deletion is remembered as well.
    other = api.register(api.create_join_token("gpu-a"), machine_id="gpu-2", hostname="gpu-2")
    assert other["node_id"] != node_id
    assert api.delete(f"/api/v1/nodes/{node_id}").status_code == 204
    assert (
        api.register(api.create_join_token("gpu-a"), machine_id="gpu-1", hostname="gpu-1")[
            "node_id"
        ]
        == node_id
    )


class InProcess:
    """The calls of fleetd.client.Client that the rollout driver makes, answered by the app in
    process."""

    def __init__(self, api):
        self.api = api

    def _call(self, method, path, body=None):
        from fleetd.client import ClientError

        resp = self.api.call(method, path, json=body)
        data = resp.get_json()
        if resp.status_code >= 400:
            raise ClientError(data["error"]["message"], resp.status_code, data["error"]["code"])
        return data

    def get(self, path, **params):
        return self._call("GET", path + ("?" + urllib.parse.urlencode(params) if params else ""))

    def post(self, path, body=None):
        return self._call("POST", path, body or {})

    def patch(self, path, body):
        return self._call("PATCH", path, body)


def test_the_driver_begins_no_node_outside_the_window_or_while_paused_and_stops_when_aborted(api):
    from fleetd.provision.bootstrap import BootstrapOptions
    from fleetd.provision.rollout import RolloutDriver, parse_window

    api.create_fleet("gpu-a")
    _nodes(api, 2, api.create_join_token("gpu-a", max_uses=10))
    said = []
    options = BootstrapOptions(
        fleet="gpu-a", bundle=types.SimpleNamespace(version="0.2.0", sha256=SHA)
    )
    noon = dt.datetime(2026, 1, 5, 12, 0, tzinfo=dt.timezone.utc)  # a Monday

    def driver(on_wait):
        return RolloutDriver(
            InProcess(api),
            options,
            ssh_options=None,
            progress=lambda *a: said.append(a[2]),
            sleep=lambda _s: on_wait(),
            now=lambda: noon,
        )

    # Outside its window (Europe/Paris nights) no node begins; an abort from anywhere ends the wait.
    window = parse_window(["22:00-06:00"], "Europe/Paris")
    rollout = driver(None).start("gpu-a", 1, 1, 0, window)
    abort = lambda: api.post(f"/api/v1/rollouts/{rollout['id']}/abort")  # noqa: E731
    final = driver(abort).run(rollout["id"])
    assert final["state"] == "aborted" and {n["state"] for n in final["nodes"]} == {"skipped"}
    assert said == ["outside its window: no node begins until 2026-01-05T21:00:00Z"], said

    # Paused: the driver waits on it, and begins nothing.
    said.clear()
    rollout = driver(None).start("gpu-a", "50%", 0, 0, None)
    api.post(f"/api/v1/rollouts/{rollout['id']}/pause")
    final = driver(lambda: api.post(f"/api/v1/rollouts/{rollout['id']}/abort")).run(rollout["id"])
    assert final["state"] == "aborted" and said[0].startswith("paused: paused by token:"), said
    assert f"`fleetd rollout resume {rollout['id']}` continues it" in said[0]

    for bad in (["22:00"], ["25:00-06:00"], ["xyz 22:00-06:00"]):
        with pytest.raises(ValueError):
            parse_window(bad)
    assert parse_window(["sat,sun 00:00-23:59"]) == {
        "timezone": "UTC",
        "windows": [{"start": "00:00", "end": "23:59", "days": ["sat", "sun"]}],
    }


def test_a_driver_for_ci_stops_at_a_pause_instead_of_waiting_on_it(api):
    from fleetd.provision.bootstrap import BootstrapOptions
    from fleetd.provision.rollout import RolloutDriver

    api.create_fleet("gpu-a")
    _nodes(api, 2, api.create_join_token("gpu-a", max_uses=10))
    options = BootstrapOptions(
        fleet="gpu-a", bundle=types.SimpleNamespace(version="0.2.0", sha256=SHA)
    )

    def never(_seconds):
        raise AssertionError("a driver that stops when paused never waits on a pause")

    driver = RolloutDriver(
        InProcess(api), options, ssh_options=None, sleep=never, stop_when_paused=True
    )
    rollout = driver.start("gpu-a", 1, 1, 0, None)
    api.post(f"/api/v1/rollouts/{rollout['id']}/pause")
    final = driver.run(rollout["id"])
    assert final["state"] == "paused" and {n["state"] for n in final["nodes"]} == {"pending"}


def test_a_node_that_fails_its_validation_after_the_upgrade_pauses_the_rollout_at_once(api):
    # Not a canary, and well under --max-failures: fleetd reads the failed validation from the node
    # itself (failed_validation), whatever the driver's report says, and pauses at once.
    api.create_fleet("gpu-a")
    token = api.create_join_token("gpu-a", max_uses=10)
    sessions = {f"gpu-{i}": api.ready_node(token, f"gpu-{i}") for i in (1, 2, 3)}
    assert api.patch("/api/v1/fleets/gpu-a", {"validation": {}}).status_code == 200
    assert (
        api.post(
            "/api/v1/webhooks",
            {
                "url": "https://hooks.example.com/x",
                "secret": "0123456789abcdef",
                "events": ["rollout.state"],
            },
        ).status_code
        == 201
    )
    rollout = _start(api, canary=0, batch=1, max_failures=5)
    plain, invalid = sessions["gpu-1"][0], sessions["gpu-2"][0]
    _report(api, rollout, plain, "upgrading")
    assert (
        _report(api, rollout, plain, "failed", detail="the agent did not start")["state"]
        == "running"
    )

    node_id, session = sessions["gpu-2"]
    _report(api, rollout, node_id, "upgrading")
    api.post(f"/api/v1/nodes/{node_id}/upgrade", {"reason": "to 0.2.0", "deadline_seconds": 60})
    api.heartbeat(session)
    assert api.post(f"/api/v1/nodes/{node_id}/validate").status_code == 200
    validation = api.heartbeat(session)["validation"]
    resp = api.post(
        f"/api/v1/agent/validations/{validation['id']}",
        {
            "checks": [
                {"name": "pcie_link", "gpu": 0, "status": "failed", "detail": "max link width x8"}
            ]
        },
        token=session,
        agent=True,
    )
    assert resp.status_code == 204, resp.get_json()
    api.post(
        f"/api/v1/nodes/{node_id}/upgrade/end", {"outcome": "failed", "detail": "validation failed"}
    )
    assert api.node(node_id)["status"] == "failed_validation"
    # Validating it now would put it back in service with its upgrade still open: refused.
    refused = api.post(f"/api/v1/nodes/{node_id}/validate")
    assert refused.status_code == 409 and "upgrade" in refused.get_json()["error"]["message"]
    assert api.node(node_id)["status"] == "failed_validation"
    paused = _report(
        api, rollout, invalid, "failed", detail="the driver says nothing of validation"
    )
    assert paused["state"] == "paused", paused
    assert (
        paused["state_reason"].startswith(
            f"paused by fleetd: node {invalid} failed its validation after the upgrade ("
        )
        and "pcie_link GPU 0" in paused["state_reason"]
    ), paused
    assert ("rollout.state", "paused") in [(k, b["data"]["to_status"]) for k, b in _deliveries()]
    assert (
        "is paused"
        in _report(api, rollout, sessions["gpu-3"][0], "upgrading", 409)["error"]["message"]
    )


def test_fleetd_refuses_a_node_that_begins_outside_the_rollouts_window(api, clock):
    # Whatever client drives the rollout, fleetd's clock holds it to the window.
    api.create_fleet("gpu-a")
    ids = _nodes(api, 1, api.create_join_token("gpu-a", max_uses=10))
    night = {"timezone": "UTC", "windows": [{"start": "22:00", "end": "06:00"}]}
    rollout = _start(api, canary=0, window=night)
    hours = (22 - clock.now().hour) % 24 or 24  # to the window's next opening
    clock.advance(hours * 3600 - clock.now().minute * 60 - clock.now().second - 60)
    refused = _report(api, rollout, ids["gpu-1"], "upgrading", 409)["error"]
    opens = clock.now().replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    assert (
        refused["message"]
        == f"rollout {rollout['id']} is outside its window: no node begins until "
        f"{opens.isoformat()}Z"
    ), refused
    assert refused["details"]["opens_at"] == f"{opens.isoformat()}Z"
    assert api.get(f"/api/v1/rollouts/{rollout['id']}").get_json()["nodes"][0]["state"] == "pending"
    clock.advance(60)
    assert _report(api, rollout, ids["gpu-1"], "upgrading")["nodes"][0]["state"] == "upgrading"
    clock.advance(8 * 3600)  # the window closed: a node under way finishes
    assert _report(api, rollout, ids["gpu-1"], "done")["state"] == "done"
