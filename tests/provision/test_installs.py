"""Installs side by side (fleetd.provision.installs, templates/fleet-agent-install.sh and
fleet-agent-versions.sh): the scripts on a directory of this machine, then upgrades over real SSH to
a test host whose /opt/fleet-agent is a small tmpfs, filled up before each step of the upgrade."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetd.provision import rendering
from tests.provision.conftest import BROKEN_AGENT, REPO, repack_bundle
from tests.provision.test_bootstrap import agent_pids
from tests.support import wait_until

LEGACY_INSTALL = REPO / "tests" / "fixtures" / "legacy" / "fleet-agent-install.sh"
SERVER = "https://fleetd.example:8443"


def versions(install_dir, action, *args):
    """fleet-agent-versions.sh ACTION INSTALL_DIR ARGS; the CompletedProcess."""
    return subprocess.run(
        ["sh", "-s", "--", action, str(install_dir), *map(str, args)],
        input=rendering.script(rendering.VERSIONS_SCRIPT),
        capture_output=True,
        text=True,
        timeout=60,
    )


def fake_install(root, version, mtime=None):
    """An install's files as fleet-agent-install.sh leaves them (a stand-in entry point)."""
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "lib").mkdir(exist_ok=True)
    (root / "bin" / "fleet-agent").write_text("#!/bin/sh\necho " + version + "\n")
    (root / "bin" / "fleet-agent").chmod(0o755)
    (root / "bundle.json").write_text(json.dumps({"version": version, "bundle_sha256": "a" * 64}))
    if mtime is not None and root.name != "fleet-agent":
        os.utime(root, (mtime, mtime))
    return root


def legacy_unit(install_dir):
    """The unit as the templates rendered it for the older layout (ExecStart without current)."""
    unit = rendering.render_unit(
        rendering.template_vars(server_url=SERVER, install_dir=str(install_dir))
    )
    return unit.replace(f"{install_dir}/current/bin/fleet-agent", f"{install_dir}/bin/fleet-agent")


def facts_installed(install_dir, tmp_path):
    from fleetd.provision.bootstrap import parse_facts

    result = subprocess.run(
        ["sh", "-s", "--", "python3", str(install_dir), *(str(tmp_path / d) for d in "abc")],
        input=rendering.script(rendering.FACTS_SCRIPT),
        capture_output=True,
        text=True,
        timeout=60,
    )
    facts = parse_facts(result.stdout)
    return facts["installed_version"], facts["install_current"]


def test_an_install_of_the_older_layout_is_taken_over_switched_from_and_back_and_its_unit_too(
    tmp_path,
):
    install = fake_install(tmp_path / "fleet-agent", "1.0")
    unit = tmp_path / "fleet-agent.service"
    unit.write_text(legacy_unit(install))
    assert facts_installed(install, tmp_path) == ("1.0", "")

    adopted = versions(install, "adopt")
    assert adopted.returncode == 0 and adopted.stdout == "current=.\n", adopted.stderr
    assert os.readlink(install / "current") == "."
    assert facts_installed(install, tmp_path) == ("1.0", ".")

    fake_install(install / "versions" / "2.0-bbbbbbbbbbbb", "2.0")
    switched = versions(install, "switch", "versions/2.0-bbbbbbbbbbbb", unit)
    assert switched.returncode == 0, switched.stderr
    assert switched.stdout.splitlines() == [
        "previous=.",
        "current=versions/2.0-bbbbbbbbbbbb",
        "unit=rewritten",
    ]
    assert os.readlink(install / "previous") == "."
    assert facts_installed(install, tmp_path) == ("2.0", "versions/2.0-bbbbbbbbbbbb")
    # The unit is now the one the templates render: a later bootstrap rewrites nothing.
    assert unit.read_text() == rendering.render_unit(
        rendering.template_vars(server_url=SERVER, install_dir=str(install))
    )
    assert versions(install, "switch", "versions/2.0-bbbbbbbbbbbb", unit).stdout.splitlines() == [
        "previous=versions/2.0-bbbbbbbbbbbb",
        "current=versions/2.0-bbbbbbbbbbbb",
    ]

    # Back to the older install, and the new one goes; the older one was never touched.
    back = versions(install, "switch", ".")
    assert back.returncode == 0 and "current=." in back.stdout, back.stderr
    discarded = versions(install, "discard", "versions/2.0-bbbbbbbbbbbb")
    assert discarded.stdout == "removed=versions/2.0-bbbbbbbbbbbb\n", discarded.stderr
    assert not (install / "previous").is_symlink()
    assert not (install / "versions" / "2.0-bbbbbbbbbbbb").exists()
    assert facts_installed(install, tmp_path) == ("1.0", ".")
    assert (install / "bin" / "fleet-agent").read_text() == "#!/bin/sh\necho 1.0\n"


def test_a_switch_to_an_unfinished_install_and_a_discard_of_the_current_one_are_refused(tmp_path):
    install = tmp_path / "fleet-agent"
    fake_install(install / "versions" / "1.0-aaaaaaaaaaaa", "1.0")
    assert versions(install, "switch", "versions/1.0-aaaaaaaaaaaa").returncode == 0
    unfinished = fake_install(install / "versions" / "2.0-bbbbbbbbbbbb", "2.0")
    (unfinished / "bundle.json").unlink()  # what an install that did not finish leaves
    refused = versions(install, "switch", "versions/2.0-bbbbbbbbbbbb")
    assert refused.returncode == 2 and "no finished install" in refused.stderr
    for bad in ("versions/../..", "/etc", "versions/1.0-aaaaaaaaaaaa/bin"):
        assert versions(install, "switch", bad).returncode == 2, bad
    kept = versions(install, "discard", "versions/1.0-aaaaaaaaaaaa")
    assert kept.returncode == 2 and "it stays" in kept.stderr
    assert os.readlink(install / "current") == "versions/1.0-aaaaaaaaaaaa"
    assert (install / "versions" / "1.0-aaaaaaaaaaaa" / "bundle.json").exists()


def test_prune_keeps_the_running_install_and_the_one_before_and_removes_the_rest(tmp_path):
    install = fake_install(tmp_path / "fleet-agent", "0.9")  # the older layout, oldest of all
    (install / "pyvenv.cfg").write_text("home = /usr/bin\n")
    fake_install(install / "versions" / "1.0-aaaaaaaaaaaa", "1.0", mtime=1_000)
    fake_install(install / "versions" / "1.1-bbbbbbbbbbbb", "1.1", mtime=2_000)
    fake_install(install / "versions" / "1.2-cccccccccccc", "1.2", mtime=3_000)
    unfinished = fake_install(install / "versions" / "1.3-dddddddddddd", "1.3", mtime=4_000)
    (unfinished / "bundle.json").unlink()
    # 1.0 ran before 1.2 (1.1 was an upgrade switched back from, left behind).
    (install / "previous").symlink_to("versions/1.0-aaaaaaaaaaaa")
    (install / "current").symlink_to("versions/1.2-cccccccccccc")

    pruned = versions(install, "prune", 2)
    assert pruned.returncode == 0, pruned.stderr
    assert sorted(pruned.stdout.splitlines()) == [
        "removed=.",
        "removed=versions/1.1-bbbbbbbbbbbb",
        "removed=versions/1.3-dddddddddddd",
    ]
    assert sorted(p.name for p in install.iterdir()) == ["current", "previous", "versions"]
    assert sorted(p.name for p in (install / "versions").iterdir()) == [
        "1.0-aaaaaaaaaaaa",
        "1.2-cccccccccccc",
    ]
    once = versions(install, "prune", 1)
    assert (
        once.stdout == "removed=versions/1.0-aaaaaaaaaaaa\n"
        and not (install / "previous").is_symlink()
    )
    assert versions(install, "prune", 1).stdout == ""


# ------------------------------------------------------------------ over SSH, with a full disk


def on_host(host, script, timeout=120):
    """Run a shell script inside the test host; its stdout (AssertionError when it fails)."""
    result = host.exec("sh", "-c", script, timeout=timeout)
    assert result.returncode == 0, f"{script}: {result.stdout}{result.stderr}"
    return result.stdout


def free_space(host, kib=None, inodes=None):
    """Leave `kib` KiB (and/or `inodes` inodes) free on the host's /opt/fleet-agent: a filler takes
    the rest (the filler from before goes first)."""
    on_host(host, "rm -rf /opt/fleet-agent/.filler && mkdir /opt/fleet-agent/.filler")
    if inodes is not None:
        free = int(on_host(host, "df -Pi /opt/fleet-agent | awk 'NR == 2 { print $4 }'"))
        assert free >= inodes, (free, inodes)
        on_host(
            host,
            f"cd /opt/fleet-agent/.filler && seq 1 {free - inodes} | xargs touch",
            timeout=300,
        )
    if kib is not None:
        free = int(on_host(host, "df -Pk /opt/fleet-agent | awk 'NR == 2 { print $4 }'"))
        if free > kib:
            on_host(host, f"fallocate -l {(free - kib) * 1024} /opt/fleet-agent/.filler/bytes")


def install_inodes(host, bundle):
    """How many inodes an install of `bundle` takes (the versions directory, the venv, bundle.json),
    measured by installing it into a tmpfs of its own on the host."""
    return int(
        on_host(
            host,
            "mkdir -p /opt/probe && mount -t tmpfs -o size=256m probe /opt/probe && "
            "before=$(df -Pi /opt/probe | awk 'NR == 2 { print $3 }') && "
            f"sh {REPO / 'templates' / rendering.INSTALL_SCRIPT} {bundle.path} python3 /opt/probe "
            ">/dev/null && "
            "after=$(df -Pi /opt/probe | awk 'NR == 2 { print $3 }') && "
            "umount /opt/probe && rmdir /opt/probe && echo $((after - before))",
            timeout=300,
        )
    )


def running_bundle(lab, node_id, sha, since):
    """Wait until the node heartbeats after `since` running bundle `sha`; returns the node."""
    return wait_until(
        lambda: (
            lambda n: (
                n if n and n["bundle_sha256"] == sha and n["last_heartbeat_at"] != since else None
            )
        )(lab.api.node(node_id)),
        60,
        interval=0.5,
        message=f"node {node_id} to heartbeat on bundle {sha[:12]}",
    )


def bootstrap(lab, bundle, host, *extra, env=None):
    """`fleetd bootstrap` of one host with no free-space preflight (the disk fills up on purpose);
    (exit code, its row, stderr)."""
    extra = ("--min-free-mb", "0", *extra)
    result = lab.fleetd_cli(*lab.bootstrap_args(bundle, host, extra=extra), env=env)
    rows = json.loads(result.stdout)
    return result.returncode, rows[0], result.stderr


@pytest.mark.integration
def test_a_full_disk_at_each_step_of_an_upgrade_leaves_the_agent_running_on_the_old_version(
    lab_factory, bundle, next_bundle, tmp_path
):
    lab = lab_factory(["l4_x4"])
    (host,) = lab.hosts
    on_host(
        host,
        "mkdir -p /opt/fleet-agent && "
        "mount -t tmpfs -o size=64m,nr_inodes=20000,mode=0755 fleet-agent /opt/fleet-agent",
    )
    # An agent installed and enrolled as fleetd did before versioned installs: one venv in
    # /opt/fleet-agent, upgraded in place, and a unit that runs /opt/fleet-agent/bin/fleet-agent.
    on_host(host, f"sh {LEGACY_INSTALL} {bundle.path} python3 /opt/fleet-agent", timeout=300)
    templates = shutil.copytree(REPO / "templates", tmp_path / "legacy-templates")
    unit_template = templates / rendering.UNIT_TEMPLATE
    unit_template.write_text(
        unit_template.read_text().replace("/current/bin/fleet-agent", "/bin/fleet-agent")
    )
    code, row, stderr = bootstrap(
        lab, bundle, host, env=lab.env(FLEETD_TEMPLATES_DIR=str(templates))
    )
    assert code == 0 and row["result"] == "enrolled", (row, stderr)
    node_id = row["node_id"]
    on_host(host, "rm /opt/fleet-agent/current")
    unit = "/etc/systemd/system/fleet-agent.service"
    assert "ExecStart=/opt/fleet-agent/bin/fleet-agent run" in host.path(unit).read_text()
    entry = host.path("/opt/fleet-agent/bin/fleet-agent").read_bytes()
    legacy = {
        p: host.path(f"/opt/fleet-agent/{p}").read_bytes()
        for p in ("bundle.json", "bin/fleet-agent", "pyvenv.cfg")
    }
    needed_inodes = install_inodes(host, next_bundle)
    lab.api.wait_status(node_id, "ready")
    upgrading = f"upgrading the agent {bundle.version} -> {next_bundle.version}"

    def fails_and_the_old_agent_runs(step, *extra):
        last = lab.api.node(node_id)["last_heartbeat_at"]
        code, row, stderr = bootstrap(lab, next_bundle, host, *extra)
        assert code == 1, (row, stderr)
        # Each rerun names the version that runs as the one it upgrades from.
        assert upgrading in stderr, stderr
        assert step in row["reason"] and "no space left on " in row["reason"], row["reason"]
        assert f"node {node_id} stays out of service (upgrade failed" in row["reason"]
        assert "the agent's log ends" not in row["reason"], row["reason"]  # it is not the cause
        node = running_bundle(lab, node_id, bundle.sha256, last)
        assert node["status"] == "drained" and node["upgrade"]["failed"], node
        assert {p: host.path(f"/opt/fleet-agent/{p}").read_bytes() for p in legacy} == legacy
        assert sorted(os.listdir(host.path("/opt/fleet-agent/versions"))) == []
        return row

    # No byte left: the venv cannot be made.
    free_space(host, kib=0)
    fails_and_the_old_agent_runs("while making the venv")
    # A few MiB: pip fails halfway; what it wrote goes.
    free_space(host, kib=4096)
    fails_and_the_old_agent_runs(f"while installing fleet-agent {next_bundle.version} with pip")
    # The agent of the older layout is whole: it survives a restart (what a crash or a reboot does).
    last = lab.api.node(node_id)["last_heartbeat_at"]
    pids = agent_pids(host)
    on_host(host, "systemctl restart fleet-agent.service", timeout=180)
    running_bundle(lab, node_id, bundle.sha256, last)
    assert (
        agent_pids(host) != pids
        and host.path("/opt/fleet-agent/bin/fleet-agent").read_bytes() == entry
    )
    # Inodes for the whole install and one more (the versions directory is there from the runs
    # before; the probe counted it): the install is made, the link previous too, and the switch of
    # current fails, leaving it as it was.
    free_space(host, inodes=needed_inodes)
    row = fails_and_the_old_agent_runs("while pointing current at versions/")
    assert "the new install was removed" in row["reason"], row["reason"]
    assert not host.path("/opt/fleet-agent/current").is_symlink()
    # No room in the host's /tmp for the bundle: said before anything is uploaded. (The tests' own
    # directory stays seen through: the host's sshd reads its config and keys from there.)
    on_host(host, "rm -rf /opt/fleet-agent/.filler")
    ours = Path("/tmp") / lab.ssh.root.relative_to("/tmp").parts[0]
    on_host(
        host,
        f"mkdir -p /run/all-tmp && mount --bind /tmp /run/all-tmp && "
        f"mount -t tmpfs -o size=1m small-tmp /tmp && mkdir {ours} && "
        f"mount --bind /run/all-tmp/{ours.name} {ours}",
    )
    try:
        fails_and_the_old_agent_runs("for the bundle")
    finally:
        on_host(host, f"umount {ours} && umount /tmp && umount /run/all-tmp")

    # A rollout runs bootstrap's preflight before it drains a node: with 512 MiB asked for (the
    # default) the host is refused, and a rollout with --wait (for CI) ends failed, exit status 3.
    def statuses():
        return [e["to_status"] for e in lab.api.events(node_id) if e["kind"] == "node.status"]

    before = statuses()
    refused = lab.rollout(next_bundle, "--wait")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    (detail,) = [n["detail"] for n in json.loads(refused.stdout)["nodes"]]
    assert "preflight: only " in detail and "MiB free for /opt/fleet-agent (need 512" in detail
    assert statuses() == before  # never drained for it

    # With room again a rollout upgrades it from the version that runs; its unit now goes through
    # the link current, as the templates write it.
    last = lab.api.node(node_id)["last_heartbeat_at"]
    run = lab.rollout(next_bundle, "--min-free-mb", "0")
    assert run.returncode == 0 and json.loads(run.stdout)["state"] == "done", (
        run.stdout + run.stderr
    )
    assert upgrading in run.stderr, run.stderr
    running_bundle(lab, node_id, next_bundle.sha256, last)
    lab.api.wait_status(node_id, "ready")
    new_dir = f"versions/{next_bundle.version}-{next_bundle.sha256[:12]}"
    assert os.readlink(host.path("/opt/fleet-agent/current")) == new_dir
    assert os.readlink(host.path("/opt/fleet-agent/previous")) == "."
    assert {p: host.path(f"/opt/fleet-agent/{p}").read_bytes() for p in legacy} == legacy
    assert "ExecStart=/opt/fleet-agent/current/bin/fleet-agent run" in host.path(unit).read_text()
    code, row, stderr = bootstrap(lab, next_bundle, host)
    assert code == 0 and row["result"] == "unchanged", (row, stderr)

    # A new agent that does not come up: the link goes back, the agent before runs again, and the
    # failure gives the new agent's last log lines.
    broken = repack_bundle(next_bundle, tmp_path / "broken", break_agent=True)
    last = lab.api.node(node_id)["last_heartbeat_at"]
    code, row, stderr = bootstrap(lab, broken, host, "--wait-timeout", "20")
    assert code == 1, (row, stderr)
    assert BROKEN_AGENT in row["reason"] and "the agent's log ends" in row["reason"], row["reason"]
    assert f"switched back to fleet-agent {next_bundle.version}, which runs again" in row["reason"]
    node = running_bundle(lab, node_id, next_bundle.sha256, last)
    assert node["status"] == "drained" and node["upgrade"]["failed"], node
    assert os.readlink(host.path("/opt/fleet-agent/current")) == new_dir
    assert sorted(os.listdir(host.path("/opt/fleet-agent/versions"))) == [new_dir[9:]]

    # A good build: it runs, and only it and the one before it stay (the older layout goes).
    good = repack_bundle(next_bundle, tmp_path / "good")
    code, row, stderr = bootstrap(lab, good, host)
    assert code == 0 and row["result"] == "upgraded", (row, stderr)
    assert "removed older installs: ." in stderr, stderr
    lab.api.wait_status(node_id, "ready")
    good_dir = f"versions/{good.version}-{good.sha256[:12]}"
    assert os.readlink(host.path("/opt/fleet-agent/current")) == good_dir
    assert os.readlink(host.path("/opt/fleet-agent/previous")) == new_dir
    assert sorted(os.listdir(host.path("/opt/fleet-agent"))) == ["current", "previous", "versions"]
    assert sorted(os.listdir(host.path("/opt/fleet-agent/versions"))) == sorted(
        [new_dir[9:], good_dir[9:]]
    )
    assert (
        Path(host.path(f"/opt/fleet-agent/{good_dir}/bundle.json")).read_text().count(good.sha256)
    )
