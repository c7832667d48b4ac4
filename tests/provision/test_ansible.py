"""The Ansible playbooks against real SSH test hosts, and ansible-lint."""

import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from tests.provision.conftest import BROKEN_AGENT, FLEET, REPO, python_for_tools, repack_bundle
from tests.provision.test_bootstrap import agent_pids, closed_port_on, shape_uuids
from tests.support import wait_until

pytestmark = pytest.mark.integration
PLAYBOOKS = REPO / "playbooks"


def tool(name):
    path = python_for_tools() / name
    if not path.exists():
        found = shutil.which(name)
        if not found:
            pytest.skip(f"{name} is not installed (pip install ansible-core ansible-lint)")
        return found
    return str(path)


def write_inventory(lab, path):
    lines = ["[fleet_agents]"]
    lines += [f"{h.hostname} ansible_host={h.address}" for h in lab.hosts]
    lines += [
        "[fleet_agents:vars]",
        "ansible_user=root",
        f"ansible_ssh_private_key_file={lab.ssh.client_key}",
        # Host key checking stays on: the test hosts' keys are in this known_hosts, nothing else is.
        f"ansible_ssh_common_args='-o UserKnownHostsFile={lab.ssh.known_hosts} -o "
        "GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes'",
        "ansible_python_interpreter=/usr/bin/python3",
        "fleet_agent_devices_backend=fake:/opt/fake-gpus/shape.json",
        'fleet_agent_labels=\'{"rack": "r12"}\'',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def playbook(
    lab, inventory, name, bundle, control_dir, bundle_arg=None, cwd=REPO, extra=(), token=None
):
    """Run a playbook with FLEETD_TOKEN the lab's admin token, or `token`."""
    env = lab.env(
        FLEETD_TOKEN=token or lab.api.token,
        ANSIBLE_CONFIG=str(PLAYBOOKS / "ansible.cfg"),
        ANSIBLE_SSH_CONTROL_PATH_DIR=control_dir,
        ANSIBLE_LOCAL_TEMP=os.path.join(control_dir, "tmp"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        PWD=str(cwd),
    )  # as a shell that cd'd there sets it
    cmd = [
        tool("ansible-playbook"),
        "-i",
        str(inventory),
        str(PLAYBOOKS / name),
        "-e",
        f"fleetd_url={lab.fleetd.url}",
        "-e",
        f"fleet_agent_bundle={bundle_arg or bundle.path}",
        "-e",
        f"fleet_agent_fleet={FLEET}",
        *extra,
    ]
    try:  # well inside the test's own timeout, so that a run that hangs says where
        result = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
            cwd=str(cwd),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out = (
            exc.stdout.decode(errors="replace")
            if isinstance(exc.stdout, bytes)
            else exc.stdout or ""
        )
        pytest.fail(
            f"ansible-playbook {name} still ran after 240 s; its output ends:\n{out[-6000:]}"
        )
    assert (
        "flj_" not in result.stdout + result.stderr
        and lab.api.token not in result.stdout + result.stderr
        and (token or lab.api.token) not in result.stdout + result.stderr
    )
    return result


def recap(output):
    """{host: {ok, changed, failed, ...}} from the PLAY RECAP (localhost, where the inventory check
    runs, left out; it must not have failed)."""
    hosts = {}
    for match in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", output, re.M):
        hosts[match.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(2))}
    local = hosts.pop("localhost", None)
    assert local is None or local["failed"] == 0, local
    return hosts


def test_ansible_lint_passes_on_the_playbooks_and_the_role():
    result = subprocess.run(
        [tool("ansible-lint"), "--offline", "--nocolor", "playbooks/"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
        env=dict(os.environ, ANSIBLE_LINT_NODEPS="1"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 failure(s), 0 warning(s)" in result.stdout + result.stderr


def mount_state_dir(host):
    """Make /var/lib/fleet-agent a mount point on the host (a tmpfs, as a volume would be)."""
    assert host.exec("mkdir", "-p", "/var/lib/fleet-agent").returncode == 0
    mounted = host.exec(
        "mount", "-t", "tmpfs", "-o", "mode=0700,size=16m", "fleet-state", "/var/lib/fleet-agent"
    )
    assert mounted.returncode == 0, mounted.stderr


def is_mount_point(host, path):
    return host.exec("mountpoint", "-q", path).returncode == 0


def bootstrapped(lab_factory, bundle, tmp_path, shapes, mounted=()):
    """Two test hosts enrolled by bootstrap.yml; returns (lab, inventory, control dir, nodes by
    hostname). The hosts at the indexes in `mounted` have their state directory on a mount point."""
    lab = lab_factory(shapes)
    for index in mounted:
        mount_state_dir(lab.hosts[index])
    inventory = write_inventory(lab, tmp_path / "inventory.ini")
    control_dir = tempfile.mkdtemp(prefix="acp", dir="/tmp")
    result = playbook(lab, inventory, "bootstrap.yml", bundle, control_dir)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "preflight ok" in result.stdout
    nodes = {n["hostname"]: n for n in lab.api.nodes()}
    assert sorted(nodes) == sorted(h.hostname for h in lab.hosts)
    for host in lab.hosts:
        node = lab.api.wait_status(nodes[host.hostname]["id"], "ready")
        assert sorted(g["uuid"] for g in node["gpus"]) == shape_uuids(host)
        assert node["labels"] == {"rack": "r12"}
    tokens = lab.api.join_tokens()
    assert len(tokens) == 2 and all(t["max_uses"] == 1 and t["uses"] == 1 for t in tokens)
    return lab, inventory, control_dir, nodes


def test_bootstrap_playbook_makes_two_ready_nodes_a_rerun_changes_nothing_drain_undrain_remove_work(
    lab_factory, bundle, tmp_path
):
    lab, inventory, control_dir, nodes = bootstrapped(
        lab_factory, bundle, tmp_path, ["l4_x4", "a100_mig_x2"], mounted=[0]
    )
    mounted = lab.hosts[0]
    assert is_mount_point(mounted, "/var/lib/fleet-agent")
    assert mounted.path("/var/lib/fleet-agent/node.json").exists()
    try:
        before = {h.hostname: agent_pids(h) for h in lab.hosts}
        again = playbook(lab, inventory, "bootstrap.yml", bundle, control_dir)
        assert again.returncode == 0, again.stdout[-4000:]
        counts = recap(again.stdout)
        assert sorted(counts) == sorted(h.hostname for h in lab.hosts)
        assert all(c["changed"] == 0 and c["failed"] == 0 for c in counts.values()), again.stdout[
            -4000:
        ]
        assert {h.hostname: agent_pids(h) for h in lab.hosts} == before
        assert len(lab.api.join_tokens()) == 2
        # The rerun changed nothing: it is no event of the nodes (the first run is, by hostname).
        for host in lab.hosts:
            runs = [
                e["reason"]
                for e in lab.api.events(nodes[host.hostname]["id"])
                if e["kind"] == "node.bootstrap"
            ]
            assert len(runs) == 1 and runs[0].startswith(f"bootstrap on {host.hostname}: "), runs

        checked = playbook(lab, inventory, "preflight.yml", bundle, control_dir)
        assert checked.returncode == 0 and checked.stdout.count("preflight ok") == 2, (
            checked.stdout[-3000:]
        )
        assert all(c["changed"] == 0 for c in recap(checked.stdout).values())
        drained = playbook(lab, inventory, "drain.yml", bundle, control_dir)
        assert drained.returncode == 0, drained.stdout[-4000:]
        assert {n["status"] for n in lab.api.nodes()} == {"drained"}
        undrained = playbook(lab, inventory, "undrain.yml", bundle, control_dir)
        assert undrained.returncode == 0, undrained.stdout[-4000:]
        assert {n["status"] for n in lab.api.nodes()} == {"ready"}

        removed = playbook(lab, inventory, "remove.yml", bundle, control_dir)
        assert removed.returncode == 0, removed.stdout[-6000:] + removed.stderr[-3000:]
        assert lab.api.nodes() == []
        for host in lab.hosts:
            statuses = [
                e["to_status"]
                for e in lab.api.events(nodes[host.hostname]["id"])
                if e.get("to_status")
            ]
            assert statuses[-2:] == ["draining", "drained"], statuses
            for path in (
                "/opt/fleet-agent",
                "/etc/fleet-agent",
                "/etc/systemd/system/fleet-agent.service",
            ):
                assert not host.path(path).exists(), path
            if host is mounted:
                # A mount point is emptied, not removed (removing it would fail).
                assert is_mount_point(host, "/var/lib/fleet-agent")
                assert list(host.path("/var/lib/fleet-agent").iterdir()) == []
            else:
                assert not host.path("/var/lib/fleet-agent").exists()
            wait_until(lambda h=host: not agent_pids(h), 30, message="the agent to stop")
    finally:
        shutil.rmtree(control_dir, ignore_errors=True)


def test_upgrade_playbook_rolls_two_hosts_one_at_a_time_through_drain_and_undrain(
    lab_factory, bundle, next_bundle, tmp_path
):
    # Enrolled by `fleetd bootstrap`: the role takes over what the other path installed.
    lab = lab_factory(["h100_x8", "l4_x4"])
    code, results, stderr = lab.bootstrap(bundle, *lab.hosts)
    assert code == 0, (results, stderr)
    nodes = {n["hostname"]: n for n in lab.api.nodes()}
    inventory = write_inventory(lab, tmp_path / "inventory.ini")
    control_dir = tempfile.mkdtemp(prefix="acp", dir="/tmp")
    # The fleet validates its nodes: each upgraded node passes the checks before it is back (these
    # two hosts' fake drivers differ, which the built-in driver_version check would rightly refuse).
    lab.api(
        "PATCH",
        f"/api/v1/fleets/{FLEET}",
        expect=200,
        json={"validation": {"checks": ["gpus_present", "gpu_health", "pcie_link"]}},
    )
    try:
        before = {h.hostname: agent_pids(h) for h in lab.hosts}
        upgrade = playbook(lab, inventory, "upgrade.yml", next_bundle, control_dir)
        assert upgrade.returncode == 0, upgrade.stdout[-6000:] + upgrade.stderr[-3000:]
        spans = {}
        for host in lab.hosts:
            node_id = nodes[host.hostname]["id"]
            assert lab.api.node(node_id)["status"] == "ready"
            version = json.loads(host.path("/opt/fleet-agent/current/bundle.json").read_text())[
                "version"
            ]
            assert version == next_bundle.version
            assert agent_pids(host) and agent_pids(host) != before[host.hostname]
            events = [
                e
                for e in lab.api.events(node_id)
                if e.get("to_status") and e["kind"] == "node.status"
            ]
            statuses = [e["to_status"] for e in events]
            assert statuses[-5:] == ["draining", "drained", "validating", "drained", "ready"], (
                statuses
            )
            spans[host.hostname] = (events[-5]["at"], events[-1]["at"])
        first, second = (spans[h.hostname] for h in lab.hosts)
        # One at a time: the first host was back (undrained) before the second one started draining.
        assert first[1] <= second[0], spans
    finally:
        shutil.rmtree(control_dir, ignore_errors=True)


def bootstrap_runs(lab, node_id):
    """The node.bootstrap records of a node: (outcome and what follows, actor, actor_via)."""
    return [
        (e["reason"].partition(": ")[2], e["actor"], e["actor_via"])
        for e in lab.api.events(node_id)
        if e["kind"] == "node.bootstrap"
    ]


def test_bootstrap_playbook_over_an_install_switches_back_when_the_new_agent_does_not_start(
    lab_factory, bundle, next_bundle, tmp_path
):
    lab = lab_factory(["l4_x4"])
    (host,) = lab.hosts
    inventory = write_inventory(lab, tmp_path / "inventory.ini")
    control_dir = tempfile.mkdtemp(prefix="acp", dir="/tmp")
    # The playbooks act with a token of their own, or with an operator's signed-in session; the
    # records say which.
    ansible = lab.admin_token("ansible")
    session = lab.sign_in("alice")
    try:
        first = playbook(
            lab, inventory, "bootstrap.yml", bundle, control_dir, token=ansible["token"]
        )
        assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-3000:]
        (node,) = lab.api.nodes()
        node_id = node["id"]
        lab.api.wait_status(node_id, "ready")
        pids = agent_pids(host)
        old = f"versions/{bundle.version}-{bundle.sha256[:12]}"
        assert os.readlink(host.path("/opt/fleet-agent/current")) == old

        # bootstrap.yml again with a bundle whose agent does not start: installed beside the one
        # that runs, switched to, and switched back when it does not come up.
        broken = repack_bundle(next_bundle, tmp_path / "broken", break_agent=True)
        failed = playbook(
            lab,
            inventory,
            "bootstrap.yml",
            broken,
            control_dir,
            extra=("-e", "fleet_agent_wait_timeout=20"),
            token=session,
        )
        assert failed.returncode != 0
        out = " ".join(failed.stdout.split())  # the YAML callback folds long messages
        assert f"bootstrap of {host.hostname} failed at" in out, out[-4000:]
        assert BROKEN_AGENT in out, out[-4000:]
        assert f"switched back to fleet-agent {bundle.version}, which runs again" in out, out[
            -4000:
        ]
        assert recap(failed.stdout)[host.hostname]["failed"] == 1

        # The host is on the old version, its agent running and heard by fleetd again; the new
        # install is gone.
        assert os.readlink(host.path("/opt/fleet-agent/current")) == old
        assert os.listdir(host.path("/opt/fleet-agent/versions")) == [old.split("/")[1]]
        node = wait_until(
            lambda: (lambda n: n if n["bundle_sha256"] == bundle.sha256 else None)(
                lab.api.node(node_id)
            ),
            60,
            message="the agent before to heartbeat again",
        )
        lab.api.wait_status(node_id, "ready")
        assert agent_pids(host) and agent_pids(host) != pids

        # Both runs are on the node's record, each by whoever ran it: the enrolment by the
        # playbooks' own token, the failed upgrade by alice's session; the registration names the
        # token that let the host in.
        runs = bootstrap_runs(lab, node_id)
        assert [(actor, via) for _, actor, via in runs] == [
            ("token:ansible", "token:ansible"),
            ("user:alice", "session"),
        ], runs
        assert runs[0][0].startswith(f"enrolled; bundle {bundle.version}"), runs
        assert runs[1][0].startswith(f"failed; bundle {broken.version}"), runs
        assert BROKEN_AGENT in runs[1][0] and "switched back" in runs[1][0], runs
        (registered,) = [e for e in lab.api.events(node_id) if e["kind"] == "node.registered"]
        assert registered["reason"].endswith(" made by token:ansible"), registered
    finally:
        shutil.rmtree(control_dir, ignore_errors=True)


def test_the_role_gives_the_agents_a_list_of_fleetd_urls(lab_factory, bundle, tmp_path):
    lab = lab_factory(["l4_x4"])
    host = lab.hosts[0]
    dead = closed_port_on(lab.ssh.gateway)
    inventory = write_inventory(lab, tmp_path / "inventory.ini")
    extra = tmp_path / "urls.json"
    extra.write_text(json.dumps({"fleet_agent_server_url": [dead, lab.fleetd.url]}))
    control_dir = tempfile.mkdtemp(prefix="acp", dir="/tmp")
    try:
        env = lab.env(
            ANSIBLE_CONFIG=str(PLAYBOOKS / "ansible.cfg"),
            ANSIBLE_SSH_CONTROL_PATH_DIR=control_dir,
            ANSIBLE_LOCAL_TEMP=os.path.join(control_dir, "tmp"),
            ANSIBLE_NOCOLOR="1",
        )
        result = subprocess.run(
            [
                tool("ansible-playbook"),
                "-i",
                str(inventory),
                str(PLAYBOOKS / "bootstrap.yml"),
                "-e",
                f"fleetd_url={lab.fleetd.url}",
                "-e",
                f"fleet_agent_bundle={bundle.path}",
                "-e",
                f"fleet_agent_fleet={FLEET}",
                "-e",
                f"@{extra}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=str(REPO),
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
        assert "flj_" not in result.stdout + result.stderr
        config = host.path("/etc/fleet-agent/agent.toml").read_text()
        assert f"server_url = {json.dumps([dead, lab.fleetd.url])}" in config.splitlines()
        stored = json.loads(host.path("/var/lib/fleet-agent/node.json").read_text())
        assert stored["server_urls"] == [dead, lab.fleetd.url]
        lab.api.wait_status(stored["node_id"], "ready")
        # The run is on the node's record, as the CLI's runs are.
        (run,) = [e for e in lab.api.events(stored["node_id"]) if e["kind"] == "node.bootstrap"]
        assert run["reason"].startswith(
            f"bootstrap on {host.hostname}: enrolled; bundle {bundle.version}"
        ), run

        # The CLI takes over what the role wrote with the same settings: the same files (their
        # "Managed by" line names every path), so nothing is rewritten and the agent keeps running.
        pids = agent_pids(host)
        code, rows, stderr = lab.bootstrap(
            bundle,
            host,
            extra=["--server-url", dead, "--server-url", lab.fleetd.url, "--label", "rack=r12"],
        )
        assert code == 0 and rows[host.address]["result"] == "unchanged", (rows, stderr)
        assert agent_pids(host) == pids

        # A revoke holds: the role refuses the host before changing anything on it.
        lab.api("POST", f"/api/v1/nodes/{stored['node_id']}/revoke", expect=200)
        refused = subprocess.run(
            [
                tool("ansible-playbook"),
                "-i",
                str(inventory),
                str(PLAYBOOKS / "bootstrap.yml"),
                "-e",
                f"fleetd_url={lab.fleetd.url}",
                "-e",
                f"fleet_agent_bundle={bundle.path}",
                "-e",
                f"fleet_agent_fleet={FLEET}",
                "-e",
                f"@{extra}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=str(REPO),
            stdin=subprocess.DEVNULL,
        )
        said = " ".join(refused.stdout.split())
        assert (
            refused.returncode != 0
            and f"node {stored['node_id']} of {host.hostname} was revoked" in said
        ), said[-3000:]
        assert (
            "set fleet_agent_readmit=true" in said
            and lab.api.node(stored["node_id"])["status"] == "revoked"
        )
    finally:
        shutil.rmtree(control_dir, ignore_errors=True)


def enrolled_by_the_cli(lab_factory, bundle, tmp_path):
    """Two test hosts enrolled by `fleetd bootstrap`; returns (lab, node ids by hostname, inventory,
    control dir)."""
    lab = lab_factory(["h100_x8", "l4_x4"])
    code, results, stderr = lab.bootstrap(bundle, *lab.hosts)
    assert code == 0, (results, stderr)
    ids = {h.hostname: results[h.address]["node_id"] for h in lab.hosts}
    return (
        lab,
        ids,
        write_inventory(lab, tmp_path / "inventory.ini"),
        tempfile.mkdtemp(prefix="acp", dir="/tmp"),
    )


def to_statuses(lab, node_id):
    return [e["to_status"] for e in lab.api.events(node_id) if e.get("to_status")]


def test_upgrade_playbook_keeps_a_failed_node_out_of_service_and_a_cordoned_node_never_ready(
    lab_factory, bundle, next_bundle, tmp_path
):
    lab, ids, inventory, control_dir = enrolled_by_the_cli(lab_factory, bundle, tmp_path)
    first, second = lab.hosts
    try:
        # A bundle path that is not there stops the run before any node is drained.
        missing = playbook(
            lab,
            inventory,
            "upgrade.yml",
            bundle,
            control_dir,
            bundle_arg="dist/nothing-here.tar.gz",
            cwd=tmp_path,
        )
        assert missing.returncode != 0
        assert (
            f"no bundle at dist/nothing-here.tar.gz (looked for {tmp_path}/dist/nothing-here.tar.gz"
            in " ".join(missing.stdout.split())
        ), missing.stdout[-3000:]
        assert all(to_statuses(lab, node_id) == ["pending", "ready"] for node_id in ids.values())

        # A bundle whose agent does not start: the first host's upgrade fails, its node stays out of
        # service (drained, its reason naming the failed upgrade, never ready) and the run gives the
        # cause from the agent's log; the second host is never touched.
        broken = repack_bundle(next_bundle, tmp_path / "broken", break_agent=True)
        failed = playbook(
            lab,
            inventory,
            "upgrade.yml",
            broken,
            control_dir,
            extra=("-e", "fleet_agent_wait_timeout=30"),
        )
        assert failed.returncode != 0
        out = " ".join(failed.stdout.split())  # the YAML callback folds long messages
        assert f"node {ids[first.hostname]} stays out of service (upgrade failed" in out, out[
            -4000:
        ]
        assert BROKEN_AGENT in out, out[-4000:]
        # It went back to the install before, whose agent runs again.
        assert f"switched back to fleet-agent {bundle.version}, which runs again" in out, out[
            -4000:
        ]
        node = wait_until(
            lambda: (lambda n: n if n["bundle_sha256"] == bundle.sha256 else None)(
                lab.api.node(ids[first.hostname])
            ),
            60,
            message="the agent before to heartbeat again",
        )
        assert node["status"] == "drained" and node["upgrade"]["failed"], node
        assert os.listdir(first.path("/opt/fleet-agent/versions")) == [
            f"{bundle.version}-{bundle.sha256[:12]}"
        ]
        assert to_statuses(lab, ids[first.hostname])[2:4] == ["draining", "drained"]
        assert "ready" not in to_statuses(lab, ids[first.hostname])[2:]
        assert to_statuses(lab, ids[second.hostname]) == ["pending", "ready"]

        # A good bundle, given the way the docs write it (relative to where ansible-playbook runs):
        # the failed upgrade ends and the first node is ready again; the second, which an operator
        # cordoned, goes drained -> cordoned, never ready on the way.
        lab.api("POST", f"/api/v1/nodes/{ids[second.hostname]}/cordon", expect=200)
        (tmp_path / "dist").mkdir()
        shutil.copy2(next_bundle.path, tmp_path / "dist" / next_bundle.path.name)
        upgraded = playbook(
            lab,
            inventory,
            "upgrade.yml",
            next_bundle,
            control_dir,
            bundle_arg=f"dist/{next_bundle.path.name}",
            cwd=tmp_path,
        )
        assert upgraded.returncode == 0, upgraded.stdout[-6000:] + upgraded.stderr[-3000:]
        said = " ".join(upgraded.stdout.split())
        assert (
            f"node {ids[second.hostname]} is cordoned (cordoned by admin): it is upgraded and "
            "stays cordoned, as an operator left it" in said
        ), said[-4000:]
        lab.api.wait_status(ids[first.hostname], "ready")
        assert lab.api.node(ids[first.hostname])["upgrade"] is None
        assert to_statuses(lab, ids[second.hostname])[-4:] == [
            "cordoned",
            "draining",
            "drained",
            "cordoned",
        ]
        for host in lab.hosts:
            installed = json.loads(host.path("/opt/fleet-agent/current/bundle.json").read_text())
            assert (installed["version"], installed["bundle_sha256"]) == (
                next_bundle.version,
                next_bundle.sha256,
            )
            assert os.readlink(host.path("/opt/fleet-agent/previous")) == (
                f"versions/{bundle.version}-{bundle.sha256[:12]}"
            )
            # fleetd learns the new version from the heartbeats.
            wait_until(
                lambda h=host: (
                    lab.api.node(ids[h.hostname])["agent_version"] == next_bundle.version
                ),
                60,
                message="fleetd to learn the upgrade",
            )
        listed = lab.api(
            "GET", f"/api/v1/nodes?agent_version={next_bundle.version}", expect=200
        ).json()["items"]
        assert sorted(n["id"] for n in listed) == sorted(ids.values())
    finally:
        shutil.rmtree(control_dir, ignore_errors=True)


def test_upgrade_playbook_keeps_an_operators_drain_and_bootstrap_accepts_drained_and_cordoned_nodes(
    lab_factory, bundle, next_bundle, tmp_path
):
    lab, ids, inventory, control_dir = enrolled_by_the_cli(lab_factory, bundle, tmp_path)
    first, second = lab.hosts
    try:
        # An operator drained the first node (RMA pending) and cordoned the second: the upgrade
        # keeps both as they are, and says so.
        lab.api(
            "POST",
            f"/api/v1/nodes/{ids[first.hostname]}/drain",
            expect=200,
            json={"reason": "RMA pending", "deadline_seconds": 60},
        )
        lab.api.wait_status(ids[first.hostname], "drained")
        lab.api("POST", f"/api/v1/nodes/{ids[second.hostname]}/cordon", expect=200)
        upgraded = playbook(lab, inventory, "upgrade.yml", next_bundle, control_dir)
        assert upgraded.returncode == 0, upgraded.stdout[-6000:] + upgraded.stderr[-3000:]
        said = " ".join(upgraded.stdout.split())
        assert (
            f"node {ids[first.hostname]} is drained (RMA pending): it is upgraded and stays "
            "drained, as an operator left it" in said
        ), said[-4000:]
        node = lab.api.node(ids[first.hostname])
        assert node["status"] == "drained" and node["drain"]["reason"] == "RMA pending", node
        reasons = [e.get("reason") or "" for e in lab.api.events(ids[first.hostname])]
        after_rma = reasons[reasons.index("drain: RMA pending") :]
        assert not [r for r in after_rma if r.startswith("undrained")], after_rma
        assert to_statuses(lab, ids[second.hostname])[-4:] == [
            "cordoned",
            "draining",
            "drained",
            "cordoned",
        ]

        # bootstrap.yml again on the drained and the cordoned node, with a new label: both are
        # accepted as the operator left them, at once, and stay so; the label reaches fleetd.
        rerun = playbook(
            lab,
            inventory,
            "bootstrap.yml",
            next_bundle,
            control_dir,
            extra=(
                "-e",
                "fleet_agent_wait_timeout=20",
                "-e",
                '{"fleet_agent_labels": {"rack": "r13"}}',
            ),
        )
        assert rerun.returncode == 0, rerun.stdout[-6000:] + rerun.stderr[-3000:]
        said = " ".join(rerun.stdout.split())
        assert f"node {ids[second.hostname]} is cordoned (upgrade done" in said, said[-4000:]
        assert (
            "cordoned as before (cordoned by admin)): it stays so, as an operator left it" in said
        ), said[-4000:]
        assert (
            f"node {ids[first.hostname]} is drained (RMA pending): it stays so, as an operator "
            f"left it" in said
        ), said[-4000:]
        assert [lab.api.node(ids[h.hostname])["status"] for h in lab.hosts] == [
            "drained",
            "cordoned",
        ]
        for host in lab.hosts:
            wait_until(
                lambda h=host: lab.api.node(ids[h.hostname])["labels"] == {"rack": "r13"},
                60,
                message="fleetd to learn the rerun's label",
            )

        # The same bundle again changes nothing, and an older one is refused before any drain.
        again = playbook(lab, inventory, "upgrade.yml", next_bundle, control_dir)
        assert again.returncode == 0 and all(
            c["changed"] == 0 for c in recap(again.stdout).values()
        )
        older = playbook(lab, inventory, "upgrade.yml", bundle, control_dir)
        assert older.returncode != 0 and "refusing to downgrade fleet-agent" in " ".join(
            older.stdout.split()
        )
        assert [lab.api.node(ids[h.hostname])["status"] for h in lab.hosts] == [
            "drained",
            "cordoned",
        ]
    finally:
        shutil.rmtree(control_dir, ignore_errors=True)


def test_a_playbook_whose_group_matches_no_host_fails_and_says_which_group(tmp_path):
    inventory = tmp_path / "inventory.ini"
    inventory.write_text("[gpus]\ngpu-01 ansible_host=192.0.2.1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETD_", "FLEET_AGENT_"))}
    env.update(
        ANSIBLE_CONFIG=str(PLAYBOOKS / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
        HOME=str(tmp_path),
    )
    for name in (
        "preflight.yml",
        "bootstrap.yml",
        "upgrade.yml",
        "drain.yml",
        "undrain.yml",
        "remove.yml",
    ):
        result = subprocess.run(
            [
                tool("ansible-playbook"),
                "-i",
                str(inventory),
                str(PLAYBOOKS / name),
                "-e",
                "fleetd_url=http://192.0.2.2:1",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=str(tmp_path),
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode != 0, (name, result.stdout[-2000:])
        assert "no host in the inventory matches fleet_agents" in result.stdout, (
            name,
            result.stdout[-2000:],
        )
    # The group named explicitly is taken (and here unreachable, which is another failure).
    result = subprocess.run(
        [
            tool("ansible-playbook"),
            "-i",
            str(inventory),
            str(PLAYBOOKS / "drain.yml"),
            "-e",
            "fleetd_url=http://192.0.2.2:1",
            "-e",
            "fleet_agent_target=gpus",
            "--syntax-check",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=str(tmp_path),
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout + result.stderr
