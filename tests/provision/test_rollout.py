"""`fleetd rollout` over real SSH test hosts: a broken canary stops the rollout before any other
node; a rollout of a good bundle then takes every node, the failed canary too, and leaves each where
its operator left it."""

import json
import subprocess

import pytest

from tests.provision.conftest import BROKEN_AGENT, FLEET, repack_bundle
from tests.provision.test_bootstrap import agent_pids, to_statuses
from tests.support import wait_until
from tests.support.server import fleetd_cmd

pytestmark = pytest.mark.integration


def test_a_broken_canary_pauses_the_rollout_then_a_good_one_returns_nodes_to_their_operators_state(
    lab_factory, bundle, tmp_path
):
    # Four hosts show it: the canary (ready), a node in service, one an operator drained and one an
    # operator cordoned.
    lab = lab_factory(["l4_x4", "l4_x4", "l4_x4", "l4_x4"])
    code, results, stderr = lab.bootstrap(bundle, *lab.hosts)
    assert code == 0, (results, stderr)
    ids = {h.hostname: results[h.address]["node_id"] for h in lab.hosts}
    canary, serving, repair, cordoned = lab.hosts
    lab.api(
        "POST",
        f"/api/v1/nodes/{ids[repair.hostname]}/drain",
        expect=200,
        json={"reason": "RMA pending", "deadline_seconds": 60},
    )
    lab.api(
        "POST",
        f"/api/v1/nodes/{ids[cordoned.hostname]}/cordon",
        expect=200,
        json={"reason": "fan noise"},
    )
    lab.api.wait_status(ids[repair.hostname], "drained")
    for (
        host
    ) in lab.hosts:  # fleetd knows each node's bundle: the rollout takes those not on the new one
        wait_until(
            lambda h=host: lab.api.node(ids[h.hostname])["bundle_sha256"] == bundle.sha256,
            60,
            message="the node to report its bundle",
        )
    before = {
        h.hostname: (
            agent_pids(h),
            h.path("/opt/fleet-agent/current/bundle.json").read_text(),
            to_statuses(lab, ids[h.hostname]),
        )
        for h in (serving, repair, cordoned)
    }

    broken = repack_bundle(bundle, tmp_path / "broken", break_agent=True)
    driver = subprocess.Popen(
        fleetd_cmd(
            "rollout",
            "start",
            "--fleet",
            FLEET,
            "--bundle",
            str(broken.path),
            "--canary",
            "1",
            "--batch",
            "2",
            "--user",
            "root",
            "--key",
            str(lab.ssh.client_key),
            "--known-hosts",
            str(lab.ssh.known_hosts),
            "--wait-timeout",
            "30",
            "--drain-deadline",
            "60",
            "--json",
        ),
        env=lab.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        rollout = wait_until(
            lambda: next(
                (
                    r
                    for r in lab.api("GET", "/api/v1/rollouts", expect=200).json()["items"]
                    if r["state"] == "paused"
                ),
                None,
            ),
            240,
            message="the rollout to pause itself",
        )
        nodes = {n["hostname"]: n for n in rollout["nodes"]}
        assert [n["hostname"] for n in rollout["nodes"]][0] == canary.hostname and nodes[
            canary.hostname
        ]["canary"]
        assert (
            nodes[canary.hostname]["state"] == "failed"
            and BROKEN_AGENT in nodes[canary.hostname]["detail"]
        )
        assert rollout["state_reason"].startswith(
            f"paused by fleetd: canary node {ids[canary.hostname]} failed"
        )
        assert {nodes[h.hostname]["state"] for h in (serving, repair, cordoned)} == {"pending"}
        # The canary stays out of service; the others were never touched (same agent process, same
        # bundle, no new state), and the operator's drain is as it was.
        node = lab.api.node(ids[canary.hostname])
        assert node["status"] in ("drained", "lost") and node["upgrade"]["failed"], node
        for host in (serving, repair, cordoned):
            assert (
                agent_pids(host),
                host.path("/opt/fleet-agent/current/bundle.json").read_text(),
                to_statuses(lab, ids[host.hostname]),
            ) == before[host.hostname]
        assert lab.api.node(ids[serving.hostname])["status"] == "ready"
        assert lab.api.node(ids[repair.hostname])["drain"]["reason"] == "RMA pending"

        # Any CLI ends it; the driver, waiting on the pause, stops and says so.
        aborted = lab.fleetd_cli("rollout", "abort", rollout["id"])
        assert aborted.returncode == 0 and "aborted (aborted by token:" in aborted.stdout, (
            aborted.stdout + aborted.stderr
        )
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate(timeout=30)
    assert driver.returncode == 1, out + err
    final = json.loads(out)
    assert final["state"] == "aborted" and {n["state"] for n in final["nodes"][1:]} == {
        "skipped"
    }, final
    assert f"paused: paused by fleetd: canary node {ids[canary.hostname]} failed" in err
    status = lab.fleetd_cli("rollout", "status", rollout["id"])
    assert status.returncode == 0 and "not upgraded: the rollout was aborted" in status.stdout, (
        status.stdout
    )
    assert lab.api.node(ids[serving.hostname])["status"] == "ready"
    assert lab.api.node(ids[repair.hostname])["status"] == "drained"

    # A good bundle (rebuilt, same version), in a fleet that now has a validation gate: a new
    # rollout takes every node, the failed canary too (drained, or lost since its agent died), two
    # at a time; each is validated before it is back, and goes back where its operator left it.
    lab.api("PATCH", f"/api/v1/fleets/{FLEET}", expect=200, json={"validation": {}})
    good = repack_bundle(bundle, tmp_path / "good")
    # --wait, as CI drives it: exit status 0 for a rollout that ends done.
    run = lab.rollout(good, "--batch", "2", "--wait")
    assert run.returncode == 0, run.stdout + run.stderr
    final = json.loads(run.stdout)
    assert final["state"] == "done" and final["state_reason"] == "4 done", final
    assert [n["batch"] for n in final["nodes"]] == [1, 1, 2, 2], final
    for node in final["nodes"]:
        assert "validation passed" in node["detail"], node
    assert f"validating node {ids[canary.hostname]}" in run.stderr
    assert any(e["kind"] == "node.validation" for e in lab.api.events(ids[canary.hostname]))
    back = {h.hostname: lab.api.node(ids[h.hostname]) for h in lab.hosts}
    assert {h: (n["status"], n["upgrade"], n["bundle_sha256"]) for h, n in back.items()} == {
        canary.hostname: ("ready", None, good.sha256),
        serving.hostname: ("ready", None, good.sha256),
        repair.hostname: ("drained", None, good.sha256),
        cordoned.hostname: ("cordoned", None, good.sha256),
    }, back
    assert back[repair.hostname]["drain"]["reason"] == "RMA pending"
    assert back[cordoned.hostname]["status_reason"].endswith(
        "cordoned as before (cordon: fan noise)"
    ), back
    for host in (repair, cordoned):  # never ready on the way (after the first heartbeat's ready)
        statuses = [
            e["to_status"]
            for e in lab.api.events(ids[host.hostname])
            if e.get("to_status") and e["kind"] != "rollout.node"
        ]
        assert "ready" not in statuses[2:] and statuses[-1] == back[host.hostname]["status"], (
            statuses
        )

    # The CLI shows a node's bundle, cordons with a reason and lists every fleet's join tokens.
    shown = lab.fleetd_cli("node", "show", ids[serving.hostname])
    assert shown.returncode == 0 and good.sha256 in shown.stdout, shown.stdout + shown.stderr
    cordon = lab.fleetd_cli(
        "node", "cordon", ids[serving.hostname], "--reason", "fan noise", "--json"
    )
    assert json.loads(cordon.stdout)["status_reason"] == "cordon: fan noise", (
        cordon.stdout + cordon.stderr
    )
    tokens = lab.fleetd_cli("join-token", "list", "--json")
    assert tokens.returncode == 0 and {t["fleet"] for t in json.loads(tokens.stdout)} == {FLEET}, (
        tokens.stderr
    )

    # A revoke holds: a rerun refuses the host; --readmit enrols it again under its old id.
    lab.api("POST", f"/api/v1/nodes/{ids[serving.hostname]}/revoke", expect=200)
    code, rows, _ = lab.bootstrap(good, serving)
    assert (
        code == 1
        and "was revoked (revoked by admin): a rerun does not admit it again; give --readmit"
        in rows[serving.address]["reason"]
    ), rows
    assert lab.api.node(ids[serving.hostname])["status"] == "revoked"
    code, rows, stderr = lab.bootstrap(good, serving, extra=["--readmit"])
    assert code == 0 and rows[serving.address]["node_id"] == ids[serving.hostname], (rows, stderr)
    lab.api.wait_status(ids[serving.hostname], "ready")
