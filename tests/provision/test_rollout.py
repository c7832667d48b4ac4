"""`fleetd rollout` over real SSH test hosts: a broken canary stops the rollout before any other node."""

import json
import subprocess

import pytest

from tests.provision.conftest import BROKEN_AGENT, FLEET, repack_bundle
from tests.provision.test_bootstrap import agent_pids, to_statuses
from tests.support import wait_until
from tests.support.server import fleetd_cmd

pytestmark = pytest.mark.integration


def test_a_broken_canary_pauses_the_rollout_and_leaves_every_other_node_and_operator_drain_as_it_was(
        lab_factory, bundle, tmp_path):
    # Three hosts show it: the canary (ready), a node in service and a node an operator drained.
    lab = lab_factory(["l4_x4", "l4_x4", "l4_x4"])
    code, results, stderr = lab.bootstrap(bundle, *lab.hosts)
    assert code == 0, (results, stderr)
    ids = {h.hostname: results[h.address]["node_id"] for h in lab.hosts}
    canary, serving, repair = lab.hosts
    lab.api("POST", f"/api/v1/nodes/{ids[repair.hostname]}/drain", expect=200,
            json={"reason": "RMA pending", "deadline_seconds": 60})
    lab.api.wait_status(ids[repair.hostname], "drained")
    for host in lab.hosts:  # fleetd knows each node's bundle: the rollout takes those not on the new one
        wait_until(lambda h=host: lab.api.node(ids[h.hostname])["bundle_sha256"] == bundle.sha256, 60,
                   message="the node to report its bundle")
    before = {h.hostname: (agent_pids(h), h.path("/opt/fleet-agent/bundle.json").read_text(),
                           to_statuses(lab, ids[h.hostname])) for h in (serving, repair)}

    broken = repack_bundle(bundle, tmp_path / "broken", break_agent=True)
    driver = subprocess.Popen(
        fleetd_cmd("rollout", "start", "--fleet", FLEET, "--bundle", str(broken.path), "--canary", "1",
                   "--batch", "2", "--user", "root", "--key", str(lab.ssh.client_key), "--known-hosts",
                   str(lab.ssh.known_hosts), "--wait-timeout", "30", "--drain-deadline", "60", "--json"),
        env=lab.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        rollout = wait_until(lambda: next((r for r in lab.api("GET", "/api/v1/rollouts", expect=200).json()["items"]
                                           if r["state"] == "paused"), None), 240,
                             message="the rollout to pause itself")
        nodes = {n["hostname"]: n for n in rollout["nodes"]}
        assert [n["hostname"] for n in rollout["nodes"]][0] == canary.hostname and nodes[canary.hostname]["canary"]
        assert nodes[canary.hostname]["state"] == "failed" and BROKEN_AGENT in nodes[canary.hostname]["detail"]
        assert rollout["state_reason"].startswith(f"paused by fleetd: canary node {ids[canary.hostname]} failed")
        assert nodes[serving.hostname]["state"] == nodes[repair.hostname]["state"] == "pending"
        # The canary stays out of service; the others were never touched (same agent process, same
        # bundle, no new state), and the operator's drain is as it was.
        node = lab.api.node(ids[canary.hostname])
        assert node["status"] in ("drained", "lost") and node["upgrade"]["failed"], node
        for host in (serving, repair):
            assert (agent_pids(host), host.path("/opt/fleet-agent/bundle.json").read_text(),
                    to_statuses(lab, ids[host.hostname])) == before[host.hostname]
        assert lab.api.node(ids[serving.hostname])["status"] == "ready"
        assert lab.api.node(ids[repair.hostname])["drain"]["reason"] == "RMA pending"

        # Any CLI ends it; the driver, waiting on the pause, stops and says so.
        aborted = lab.fleetd_cli("rollout", "abort", rollout["id"])
        assert aborted.returncode == 0 and "aborted (aborted by token:" in aborted.stdout, aborted.stdout + aborted.stderr
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate(timeout=30)
    assert driver.returncode == 1, out + err
    final = json.loads(out)
    assert final["state"] == "aborted" and {n["state"] for n in final["nodes"][1:]} == {"skipped"}, final
    assert f"paused: paused by fleetd: canary node {ids[canary.hostname]} failed" in err
    status = lab.fleetd_cli("rollout", "status", rollout["id"])
    assert status.returncode == 0 and "not upgraded: the rollout was aborted" in status.stdout, status.stdout
    assert lab.api.node(ids[serving.hostname])["status"] == "ready"
    assert lab.api.node(ids[repair.hostname])["status"] == "drained"

    # In a fleet with a validation gate an upgrade validates the node before it is back: the failed
    # canary, upgraded again with a good bundle, passes the built-in checks and is ready again.
    lab.api("PATCH", f"/api/v1/fleets/{FLEET}", expect=200, json={"validation": {}})
    code, rows, stderr = lab.bootstrap(bundle, canary)
    assert code == 0 and rows[canary.address]["validation"] == "passed", (rows, stderr)
    assert f"validating node {ids[canary.hostname]}" in stderr
    assert lab.api.node(ids[canary.hostname])["status"] == "ready"
    assert any(e["kind"] == "node.validation" for e in lab.api.events(ids[canary.hostname]))

    # The CLI shows a node's bundle, cordons with a reason and lists every fleet's join tokens.
    shown = lab.fleetd_cli("node", "show", ids[serving.hostname])
    assert shown.returncode == 0 and bundle.sha256 in shown.stdout, shown.stdout + shown.stderr
    cordoned = lab.fleetd_cli("node", "cordon", ids[serving.hostname], "--reason", "fan noise", "--json")
    assert json.loads(cordoned.stdout)["status_reason"] == "cordon: fan noise", cordoned.stdout + cordoned.stderr
    tokens = lab.fleetd_cli("join-token", "list", "--json")
    assert tokens.returncode == 0 and {t["fleet"] for t in json.loads(tokens.stdout)} == {FLEET}, tokens.stderr

    # A revoke holds: a rerun refuses the host; --readmit enrols it again under its old id.
    lab.api("POST", f"/api/v1/nodes/{ids[serving.hostname]}/revoke", expect=200)
    code, rows, _ = lab.bootstrap(bundle, serving)
    assert code == 1 and "was revoked (revoked by admin): a rerun does not admit it again; give --readmit" \
        in rows[serving.address]["reason"], rows
    assert lab.api.node(ids[serving.hostname])["status"] == "revoked"
    code, rows, stderr = lab.bootstrap(bundle, serving, extra=["--readmit"])
    assert code == 0 and rows[serving.address]["node_id"] == ids[serving.hostname], (rows, stderr)
    lab.api.wait_status(ids[serving.hostname], "ready")
