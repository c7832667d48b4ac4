"""`fleetd bootstrap` against real SSH test hosts (network namespaces with their own sshd)."""

import json
import socket
import subprocess
import sys

import pytest

from tests.provision.conftest import BROKEN_AGENT, FLEET
from tests.support import wait_until

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.integration


def agent_pids(host):
    """PIDs of `fleet-agent run` processes inside the host."""
    out = subprocess.run(
        ["ip", "netns", "pids", host.name], capture_output=True, text=True, timeout=30
    ).stdout
    pids = []
    for pid in out.split():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"/fleet-agent") for a in argv) and b"run" in argv:
            pids.append(int(pid))
    return sorted(pids)


def shape_uuids(host):
    return sorted(
        g["uuid"] for g in json.loads(host.path("/opt/fake-gpus/shape.json").read_text())["gpus"]
    )


def file_state(host, *paths):
    return {p: (host.path(p).stat().st_mtime_ns, host.path(p).read_bytes()) for p in paths}


def test_three_hosts_get_ready_a_rerun_only_starts_a_stopped_agent_an_unreachable_host_fails_alone(
    lab_factory, bundle
):
    lab = lab_factory(["l4_x4", "h100_x8", "a100_mig_x2"])
    hosts = lab.hosts
    code, results, stderr = lab.bootstrap(bundle, *hosts)
    assert code == 0, (results, stderr)
    for host in hosts:
        row = results[host.address]
        assert row["result"] == "enrolled", row
        assert row["preflight"].startswith("ok (Python 3.")
        node = lab.api.wait_status(row["node_id"], "ready")
        assert sorted(g["uuid"] for g in node["gpus"]) == shape_uuids(host)
        assert row["gpus"] == len(node["gpus"])
        assert node["fleet"] == FLEET and node["hostname"] == host.hostname
        assert (
            json.loads(host.path("/opt/fleet-agent/current/bundle.json").read_text())["version"]
            == bundle.version
        )
        config = tomllib.loads(host.path("/etc/fleet-agent/agent.toml").read_text())
        assert config["server_url"] == lab.fleetd.url and config["devices"]["backend"].startswith(
            "fake:"
        )
        assert "Type=notify" in host.path("/etc/systemd/system/fleet-agent.service").read_text()
        assert len(agent_pids(host)) == 1
    tokens = lab.api.join_tokens()
    assert len(tokens) == 3 and all(t["max_uses"] == 1 and t["uses"] == 1 for t in tokens)
    # Each run is on its node's record, the host named by its hostname (not as it was reached).
    for host in hosts:
        (run,) = [
            e
            for e in lab.api.events(results[host.address]["node_id"])
            if e["kind"] == "node.bootstrap"
        ]
        assert run["reason"].startswith(f"bootstrap on {host.hostname}: enrolled;"), run
    # The tokens never reached the command lines or the logs of the hosts.
    assert "flj_" not in stderr

    watched = (
        "/etc/fleet-agent/agent.toml",
        "/etc/systemd/system/fleet-agent.service",
        "/opt/fleet-agent/current/bundle.json",
    )
    before = {h.name: (agent_pids(h), file_state(h, *watched)) for h in hosts}
    code, again, stderr = lab.bootstrap(bundle, *hosts)
    assert code == 0, (again, stderr)
    for host in hosts:
        assert again[host.address]["result"] == "unchanged", again[host.address]
        assert again[host.address]["node_id"] == results[host.address]["node_id"]
        assert (agent_pids(host), file_state(host, *watched)) == before[host.name]
        # A run that changed nothing adds no record.
        node_id = results[host.address]["node_id"]
        assert [e["kind"] for e in lab.api.events(node_id)].count("node.bootstrap") == 1
    assert len(lab.api.join_tokens()) == 3
    assert len(lab.api.nodes()) == 3

    # One host unreachable, one whose agent was stopped, one untouched: each is told apart.
    stopped, down, untouched = hosts
    assert stopped.exec("systemctl", "stop", "fleet-agent.service", timeout=120).returncode == 0
    wait_until(lambda: not agent_pids(stopped), 30, message="the agent to stop")
    down.stop_sshd()
    code, partial, stderr = lab.bootstrap(bundle, *hosts)
    assert code == 1
    assert partial[down.address]["result"] == "failed"
    assert "cannot connect" in partial[down.address]["reason"]
    assert (
        partial[stopped.address]["result"] == "updated"
        and partial[stopped.address]["reason"] == "started"
    )
    assert len(agent_pids(stopped)) == 1
    assert partial[untouched.address]["result"] == "unchanged", partial[untouched.address]
    assert [n["status"] for n in lab.api.nodes()] == ["ready"] * 3


def test_unknown_or_changed_host_keys_are_refused_before_any_command_runs(
    lab_factory, bundle, tmp_path
):
    lab = lab_factory(["l4_x4", "l4_x4"])
    unknown, changed = lab.hosts
    impostor = tmp_path / "impostor"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True, timeout=30
    )
    kind, key = impostor.with_suffix(".pub").read_text().split()[:2]
    lab.ssh.known_hosts.write_text(f"{changed.address} {kind} {key}\n")

    code, results, _ = lab.bootstrap(bundle, unknown, changed)
    assert code == 1
    assert results[unknown.address]["result"] == "failed"
    reason = results[unknown.address]["reason"]
    assert "is not in" in reason and "--accept-new-host-keys" in reason
    assert (
        results[changed.address]["result"] == "failed"
        and "CHANGED" in results[changed.address]["reason"]
    )
    for host in (unknown, changed):
        assert host.accepted_logins() == 0
        assert not host.path("/opt/fleet-agent").exists()
    assert lab.api.join_tokens() == []
    assert lab.ssh.known_hosts.read_text() == f"{changed.address} {kind} {key}\n"

    # Trust on first use records the unknown key; a changed key stays refused. An impossible disk
    # requirement stops both right after preflight, which is enough to prove who got in.
    code, results, _ = lab.bootstrap(
        bundle, unknown, changed, extra=["--accept-new-host-keys", "--min-free-mb", str(2**40)]
    )
    assert code == 1
    assert results[unknown.address]["reason"].startswith("preflight: only")
    assert unknown.accepted_logins() >= 1
    assert unknown.known_hosts_line() in lab.ssh.known_hosts.read_text().splitlines()
    assert "CHANGED" in results[changed.address]["reason"] and changed.accepted_logins() == 0


def test_a_new_bundle_upgrades_in_place_through_drain_and_undrain_and_remove_deletes_the_nodes(
    lab_factory, bundle, next_bundle
):
    lab = lab_factory(["l4_x4", "h100_x8"])
    hosts = lab.hosts
    # The first host keeps its agent state on a mount point (a volume): removal empties it, keeps
    # it.
    assert hosts[0].exec("mkdir", "-p", "/var/lib/fleet-agent").returncode == 0
    assert (
        hosts[0]
        .exec(
            "mount",
            "-t",
            "tmpfs",
            "-o",
            "mode=0700,size=16m",
            "fleet-state",
            "/var/lib/fleet-agent",
        )
        .returncode
        == 0
    )
    code, results, stderr = lab.bootstrap(bundle, *hosts)
    assert code == 0, (results, stderr)
    assert hosts[0].path("/var/lib/fleet-agent/node.json").exists()
    node_ids = {h.address: results[h.address]["node_id"] for h in hosts}
    old_pids = {h.name: agent_pids(h) for h in hosts}

    code, upgraded, stderr = lab.bootstrap(next_bundle, *hosts)
    assert code == 0, (upgraded, stderr)
    for host in hosts:
        row = upgraded[host.address]
        assert row["result"] == "upgraded" and row["node_id"] == node_ids[host.address], row
        assert (
            json.loads(host.path("/opt/fleet-agent/current/bundle.json").read_text())["version"]
            == next_bundle.version
        )
        assert agent_pids(host) and agent_pids(host) != old_pids[host.name]
        statuses = [e["to_status"] for e in lab.api.events(row["node_id"]) if e.get("to_status")]
        assert statuses[-3:] == ["draining", "drained", "ready"], statuses
        assert lab.api.node(row["node_id"])["status"] == "ready"

    result = lab.fleetd_cli(
        "bootstrap",
        hosts[0].address,
        "--remove",
        "--user",
        "root",
        "--key",
        str(lab.ssh.client_key),
        "--known-hosts",
        str(lab.ssh.known_hosts),
        "--drain-deadline",
        "30",
        "--json",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    row = json.loads(result.stdout)[0]
    assert row["result"] == "removed" and row["node_id"] == node_ids[hosts[0].address]
    assert lab.api.node(node_ids[hosts[0].address]) is None
    for path in (
        "/opt/fleet-agent",
        "/etc/fleet-agent",
        "/var/lib/fleet-agent/node.json",
        "/etc/systemd/system/fleet-agent.service",
    ):
        assert not hosts[0].path(path).exists(), path
    assert hosts[0].exec("mountpoint", "-q", "/var/lib/fleet-agent").returncode == 0
    assert list(hosts[0].path("/var/lib/fleet-agent").iterdir()) == []
    wait_until(lambda: not agent_pids(hosts[0]), 30, message="the agent to stop")
    assert [n["id"] for n in lab.api.nodes()] == [node_ids[hosts[1].address]]
    assert lab.api.node(node_ids[hosts[1].address])["status"] == "ready"


def test_bootstrap_through_a_bastion_checks_the_bastions_key_too(lab_factory, bundle):
    lab = lab_factory(["l4_x4", "l4_x4"])
    bastion, target = lab.hosts
    # An impossible disk requirement stops at preflight: enough to see who connected through whom.
    stop_after_preflight = ["--jump", f"root@{bastion.address}", "--min-free-mb", str(2**40)]
    code, results, _ = lab.bootstrap(bundle, target, extra=stop_after_preflight)
    assert code == 1 and results[target.address]["reason"].startswith("preflight: only"), results
    assert f"Connection from {bastion.address}" in target.sshd_log.read_text()
    assert target.accepted_logins() == 1 and bastion.accepted_logins() == 1

    lab.ssh.known_hosts.write_text(target.known_hosts_line() + "\n")
    code, results, _ = lab.bootstrap(bundle, target, extra=stop_after_preflight)
    assert code == 1
    assert f"host key of {bastion.address} is not in" in results[target.address]["reason"]
    assert bastion.accepted_logins() == 1 and target.accepted_logins() == 1


def closed_port_on(address):
    """A URL on `address` that nothing listens on (connection refused)."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        return f"http://{address}:{probe.getsockname()[1]}"


def test_agents_get_every_fleetd_url_enrol_past_a_dead_one_and_keep_their_node_as_the_list_changes(
    lab_factory, bundle
):
    lab = lab_factory(["l4_x4"])
    host = lab.hosts[0]
    dead = closed_port_on(lab.ssh.gateway)
    urls = [dead, lab.fleetd.url]
    code, results, stderr = lab.bootstrap(
        bundle, host, extra=["--server-url", dead, "--server-url", lab.fleetd.url]
    )
    assert code == 0, (results, stderr)
    row = results[host.address]
    assert row["result"] == "enrolled", row
    lab.api.wait_status(row["node_id"], "ready")
    assert tomllib.loads(host.path("/etc/fleet-agent/agent.toml").read_text())["server_url"] == urls
    stored = json.loads(host.path("/var/lib/fleet-agent/node.json").read_text())
    assert stored["server_urls"] == urls and stored["server_url"] == dead

    # The dead URL dropped (comma-separated this time): the same control plane, so the same node;
    # the config is rewritten and the agent restarted, with no new join token.
    code, again, stderr = lab.bootstrap(bundle, host, extra=["--server-url", f"{lab.fleetd.url}"])
    assert code == 0, (again, stderr)
    assert (
        again[host.address]["result"] == "updated"
        and again[host.address]["node_id"] == row["node_id"]
    )
    assert (
        tomllib.loads(host.path("/etc/fleet-agent/agent.toml").read_text())["server_url"]
        == lab.fleetd.url
    )
    assert len(lab.api.join_tokens()) == 1 and lab.api.node(row["node_id"])["status"] == "ready"


def to_statuses(lab, node_id):
    return [e["to_status"] for e in lab.api.events(node_id) if e.get("to_status")]


def node_list_json(lab, *args):
    result = lab.fleetd_cli("node", "list", "--json", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_rollouts_refuse_downgrades_install_rebuilds_keep_operator_states_and_keep_failed_nodes_out(
    lab_factory, bundle, next_bundle, tmp_path
):
    from tests.provision.conftest import repack_bundle

    lab = lab_factory(["l4_x4", "h100_x8"])
    kept, rolled = lab.hosts

    # Preflight asks fleetd's health from the host: a forgotten --server-url (the agents' own
    # loopback) is refused before anything is installed or any join token minted.
    loopback = closed_port_on("127.0.0.1")
    code, results, _ = lab.bootstrap(bundle, kept, extra=["--server-url", loopback])
    assert code == 1
    reason = results[kept.address]["reason"]
    assert reason.startswith("preflight: the host cannot reach fleetd at " + loopback), reason
    assert not kept.path("/opt/fleet-agent").exists() and lab.api.join_tokens() == []

    code, results, stderr = lab.bootstrap(next_bundle, kept, rolled)
    assert code == 0, (results, stderr)
    assert "reaches fleetd at " + lab.fleetd.url in results[kept.address]["preflight"]
    ids = {h.address: results[h.address]["node_id"] for h in lab.hosts}
    for host in lab.hosts:
        # fleetd learns the agent's version and bundle from its heartbeats.
        wait_until(
            lambda h=host: (
                lambda n: (
                    n["agent_version"] == next_bundle.version
                    and n["bundle_sha256"] == next_bundle.sha256
                )
            )(lab.api.node(ids[h.address])),
            60,
            message="the node to report the bundle",
        )

    # The CLI's own (older) bundle is a downgrade: refused, the node untouched.
    code, results, _ = lab.bootstrap(bundle, kept)
    assert code == 1
    assert (
        "refusing to downgrade fleet-agent " + next_bundle.version
        in results[kept.address]["reason"]
    )
    assert "--allow-downgrade" in results[kept.address]["reason"]
    assert [e["to_status"] for e in lab.api.events(ids[kept.address]) if e.get("to_status")] == [
        "pending",
        "ready",
    ]

    # An operator's drain stays through an (allowed) downgrade, and the row and progress say so.
    lab.api(
        "POST",
        f"/api/v1/nodes/{ids[kept.address]}/drain",
        expect=200,
        json={"reason": "RMA pending", "deadline_seconds": 60},
    )
    lab.api.wait_status(ids[kept.address], "drained")
    code, results, stderr = lab.bootstrap(bundle, kept, extra=["--allow-downgrade"])
    assert code == 0, (results, stderr)
    row = results[kept.address]
    assert row["result"] == "downgraded", row
    assert "node stays drained as an operator left it (RMA pending)" in row["reason"], row
    assert f"downgrading the agent {next_bundle.version} -> {bundle.version}" in stderr
    assert "stays drained as an operator left it (RMA pending)" in stderr
    assert f"waiting for node {ids[kept.address]} to be ready" not in stderr
    statuses = [e["to_status"] for e in lab.api.events(ids[kept.address]) if e.get("to_status")]
    assert statuses == ["pending", "ready", "draining", "drained"], statuses
    wait_until(
        lambda: lab.api.node(ids[kept.address])["agent_version"] == bundle.version,
        60,
        message="fleetd to learn the downgrade",
    )
    assert lab.api.node(ids[kept.address])["status"] == "drained"
    assert [n["id"] for n in node_list_json(lab, "--version", bundle.version)] == [
        ids[kept.address]
    ]
    assert [n["id"] for n in node_list_json(lab, "--version", next_bundle.version)] == [
        ids[rolled.address]
    ]

    # A rebuilt bundle of the same version (another SHA-256) is an upgrade; on a node an operator
    # cordoned, fleetd puts it back to cordoned at the end, never ready on the way. Once installed,
    # the bundle is unchanged.
    lab.api("POST", f"/api/v1/nodes/{ids[rolled.address]}/cordon", expect=200)
    rebuilt = repack_bundle(next_bundle, tmp_path / "rebuilt")
    assert rebuilt.version == next_bundle.version and rebuilt.sha256 != next_bundle.sha256
    code, results, stderr = lab.bootstrap(rebuilt, rolled)
    assert code == 0 and results[rolled.address]["result"] == "upgraded", (results, stderr)
    assert "node stays cordoned as an operator left it" in results[rolled.address]["reason"]
    # The progress names a rebuild as one (not "V -> V"), and a cordoned node is not "waited to be
    # ready".
    assert (
        f"upgrading the agent {next_bundle.version} (rebuilt bundle of the same version, sha256 "
        f"{rebuilt.sha256[:12]})" in stderr
    ), stderr
    assert f"{next_bundle.version} -> {next_bundle.version}" not in stderr
    assert f"waiting for node {ids[rolled.address]} to be ready" not in stderr
    assert (
        json.loads(rolled.path("/opt/fleet-agent/current/bundle.json").read_text())["bundle_sha256"]
        == rebuilt.sha256
    )
    statuses = to_statuses(lab, ids[rolled.address])
    assert statuses[statuses.index("cordoned") :] == [
        "cordoned",
        "draining",
        "drained",
        "cordoned",
    ], statuses
    node = lab.api.node(ids[rolled.address])
    assert node["status"] == "cordoned" and node["upgrade"] is None, node
    wait_until(
        lambda: lab.api.node(ids[rolled.address])["bundle_sha256"] == rebuilt.sha256,
        60,
        message="fleetd to learn the rebuilt bundle",
    )
    code, results, stderr = lab.bootstrap(rebuilt, rolled)
    assert code == 0 and results[rolled.address]["result"] == "unchanged", results
    # Nothing starts, and the progress does not claim it does.
    assert f"{rolled.address}: start: fleet-agent already running" in stderr, stderr
    assert "starting fleet-agent" not in stderr and "restarting fleet-agent" not in stderr

    # An upgrade whose agent does not start keeps the node out of service (drained, its reason
    # naming the failed upgrade), the error gives the cause from the agent's log, and the host goes
    # back to the install before, whose agent heartbeats again.
    broken = repack_bundle(bundle, tmp_path / "broken", break_agent=True)
    code, results, _ = lab.bootstrap(
        broken, rolled, extra=["--allow-downgrade", "--wait-timeout", "20"]
    )
    assert code == 1
    reason = results[rolled.address]["reason"]
    assert BROKEN_AGENT in reason and "the agent's log ends" in reason, reason
    assert f"switched back to fleet-agent {rebuilt.version}, which runs again" in reason, reason
    assert f"node {ids[rolled.address]} stays out of service (upgrade failed" in reason, reason
    node = lab.api.node(ids[rolled.address])
    assert node["status"] == "drained" and node["bundle_sha256"] == rebuilt.sha256, node
    assert node["status_reason"].startswith(
        "upgrade failed (fleetd bootstrap: downgrading the agent"
    ), node
    assert node["upgrade"]["returns_to"]["status"] == "cordoned", node
    statuses = to_statuses(lab, ids[rolled.address])
    assert "ready" not in statuses[statuses.index("cordoned") :], statuses

    # Run again with the bundle it runs again: nothing to install, the failed upgrade ends and the
    # node is cordoned again, as the operator left it.
    code, results, stderr = lab.bootstrap(rebuilt, rolled)
    row = results[rolled.address]
    assert code == 0 and row["result"] == "updated", (results, stderr)
    assert row["reason"].startswith("ended the upgrade that failed before"), row
    node = lab.api.wait_status(ids[rolled.address], "cordoned")
    assert node["upgrade"] is None and node["drain"] is None, node
    statuses = to_statuses(lab, ids[rolled.address])
    assert "ready" not in statuses[statuses.index("cordoned") :], statuses

    # A dead host: --remove needs SSH; --remove --force deletes its node in fleetd alone.
    kept.stop_sshd()
    remove = [
        "bootstrap",
        kept.address,
        "--remove",
        "--user",
        "root",
        "--key",
        str(lab.ssh.client_key),
        "--known-hosts",
        str(lab.ssh.known_hosts),
        "--drain-deadline",
        "30",
        "--json",
    ]
    result = lab.fleetd_cli(*remove)
    reason = json.loads(result.stdout)[0]["reason"]
    assert result.returncode == 1 and "cannot connect" in reason and "--remove --force" in reason, (
        reason
    )
    assert lab.api.node(ids[kept.address]) is not None
    result = lab.fleetd_cli(*remove, "--force")
    assert result.returncode == 0, result.stdout + result.stderr
    row = json.loads(result.stdout)[0]
    assert row["result"] == "removed" and row["node_id"] == ids[kept.address], row
    assert "nothing on the host was touched" in row["reason"]
    assert lab.api.node(ids[kept.address]) is None
    assert [n["id"] for n in lab.api.nodes()] == [ids[rolled.address]]


def test_two_builds_of_the_same_sources_are_the_same_bytes(tmp_path):
    from fleetd.provision.bundle import build_bundle
    from tests.provision.conftest import copy_source

    source = copy_source(tmp_path / "source")
    first = build_bundle(tmp_path / "first", source=source)
    # Other times and another order of the files on disk: still the same bytes.
    for path in sorted(source.rglob("*.py"))[:50]:
        path.touch()
    second = build_bundle(tmp_path / "second", source=source)
    assert first.sha256 == second.sha256
    assert first.path.read_bytes() == second.path.read_bytes()


def test_a_rerun_without_a_bundle_builds_the_same_bytes_and_changes_nothing(lab_factory, tmp_path):
    from fleetd.provision.bundle import read_bundle
    from tests.provision.conftest import copy_source

    lab = lab_factory(["l4_x4"])
    (host,) = lab.hosts
    # No --bundle: the CLI builds one from the source tree it runs from (a copy of this checkout,
    # which nothing edits between the runs) into its cache, each run.
    source = copy_source(tmp_path / "source")
    code, results, stderr = lab.bootstrap(None, host, cwd=source)
    assert code == 0, (results, stderr)
    assert f"building the offline bundle into {lab.ssh.root / 'home'}" in stderr
    cache = lab.ssh.root / "home" / ".cache" / "fleetd" / "bundles"
    (cached,) = cache.glob("fleet-agent-bundle-*.tar.gz")
    first = read_bundle(cached)
    node_id = results[host.address]["node_id"]
    lab.api.wait_status(node_id, "ready")
    pids = agent_pids(host)
    events = len(lab.api.events(node_id))

    code, again, stderr = lab.bootstrap(None, host, cwd=source)
    assert code == 0, (again, stderr)
    assert "building the offline bundle" in stderr
    assert read_bundle(cached).sha256 == first.sha256
    row = again[host.address]
    assert row["result"] == "unchanged", row
    assert agent_pids(host) == pids
    # A run that changed nothing is no event of the node.
    later = lab.api.events(node_id)[events:]
    assert later == [], later
    assert lab.api.node(node_id)["status"] == "ready"


def test_labels_reach_fleetd_from_a_rerun_and_from_node_label_which_wins_per_key(
    lab_factory, bundle
):
    lab = lab_factory(["l4_x4"])
    (host,) = lab.hosts
    code, results, stderr = lab.bootstrap(bundle, host, extra=["--label", "rack=r1"])
    assert code == 0, (results, stderr)
    node_id = results[host.address]["node_id"]
    assert lab.api.wait_status(node_id, "ready")["labels"] == {"rack": "r1"}

    def labels_become(expected):
        return wait_until(
            lambda: (lambda n: n if n["labels"] == expected else None)(lab.api.node(node_id)),
            60,
            message=f"fleetd to show labels {expected}",
        )

    # A rerun with other labels rewrites the agent's config; its next heartbeat brings them.
    code, again, stderr = lab.bootstrap(
        bundle, host, extra=["--label", "rack=r2", "--label", "zone=z1"]
    )
    assert code == 0 and again[host.address]["result"] == "updated", (again, stderr)
    node = labels_become({"rack": "r2", "zone": "z1"})
    assert node["agent_labels"] == {"rack": "r2", "zone": "z1"} and node["label_overrides"] == {}

    # Labels set through fleetd win per key; the agent's file fills the rest, also after a rerun.
    result = lab.fleetd_cli("node", "label", node_id, "rack=r9", "gpu=l4", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["labels"] == {"rack": "r9", "zone": "z1", "gpu": "l4"}
    code, again, stderr = lab.bootstrap(bundle, host, extra=["--label", "rack=r3"])
    assert code == 0, (again, stderr)
    node = labels_become({"rack": "r9", "gpu": "l4"})
    assert node["agent_labels"] == {"rack": "r3"} and node["label_overrides"] == {
        "rack": "r9",
        "gpu": "l4",
    }
    result = lab.fleetd_cli("node", "label", node_id, "--remove", "rack")
    assert result.returncode == 0 and "labels gpu=l4, rack=r3" in result.stdout, (
        result.stdout + result.stderr
    )
    assert any(
        e["kind"] == "node.labels" and "-rack" in e["reason"] for e in lab.api.events(node_id)
    )

    # Bad input is refused in the error envelope.
    bad = lab.api("PATCH", f"/api/v1/nodes/{node_id}", json={"labels": {"no spaces": "x"}})
    assert bad.status_code == 400 and bad.json()["error"]["code"], bad.text
    for body in ({"labels": "rack=r1"}, {}, {"labels": {"rack": 5}}, [1]):
        assert lab.api("PATCH", f"/api/v1/nodes/{node_id}", json=body).status_code == 400, body
    assert lab.api("PATCH", "/api/v1/nodes/nope", json={"labels": {"a": "b"}}).status_code == 404
    result = lab.fleetd_cli("node", "label", node_id)
    assert result.returncode != 0 and "give KEY=VALUE to set, or --remove KEY" in result.stderr


def test_bootstrap_records_name_the_tools_own_token_or_the_operators_saved_session(
    lab_factory, bundle
):
    lab = lab_factory(["l4_x4"])
    (host,) = lab.hosts
    # A token made for the tool, in FLEETD_TOKEN (as the Terraform module passes it on).
    tool = lab.admin_token("provisioner")
    code, results, stderr = lab.bootstrap(
        bundle, host, extra=["--label", "rack=r1"], env=lab.env(FLEETD_TOKEN=tool["token"])
    )
    assert code == 0, (results, stderr)
    node_id = results[host.address]["node_id"]
    lab.api.wait_status(node_id, "ready")

    # The operator's own session, saved by `fleetd login --provider`: no FLEETD_TOKEN.
    session = lab.sign_in("alice")
    signed_in = {k: v for k, v in lab.env().items() if k != "FLEETD_TOKEN"}
    # What a tool that takes FLEETD_TOKEN (Ansible, Terraform's drift check) is given for it.
    current = lab.fleetd_cli("token", "current", env=signed_in)
    assert current.returncode == 0 and current.stdout.strip() == session, current.stderr
    code, again, stderr = lab.bootstrap(bundle, host, extra=["--label", "rack=r2"], env=signed_in)
    assert code == 0 and again[host.address]["result"] == "updated", (again, stderr)

    runs = [
        (
            e["reason"].partition(": ")[2].partition(";")[0],
            e["actor"],
            e["actor_token_id"],
            e["actor_via"],
        )
        for e in lab.api.events(node_id)
        if e["kind"] == "node.bootstrap"
    ]
    assert runs == [
        ("enrolled", "token:provisioner", tool["id"], "token:provisioner"),
        ("updated", "user:alice", None, "session"),
    ], runs
    (registered,) = [e for e in lab.api.events(node_id) if e["kind"] == "node.registered"]
    assert registered["reason"].endswith(" made by token:provisioner"), registered
    # `fleetd node events` shows both, with the credential where the actor does not say it.
    shown = lab.fleetd_cli("node", "events", node_id)
    assert shown.returncode == 0, shown.stderr
    assert "token:provisioner" in shown.stdout and "user:alice (session)" in shown.stdout
