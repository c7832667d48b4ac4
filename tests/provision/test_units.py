"""Pure pieces of provisioning: host specs, the host-key policy, preflight verdicts, bundle
compatibility."""

import io
import json
import tarfile
import threading

import paramiko
import pytest

from fleetd.provision.bootstrap import BootstrapOptions, HostFailed, judge_preflight, parse_facts
from fleetd.provision.bundle import BundleError, check_host_compat, read_bundle
from fleetd.provision.ssh import HostKeyRejected, HostSpec, StrictHostKeyPolicy, fingerprint

GOOD_FACTS = {
    "facts_version": "1",
    "uid": "0",
    "arch": "x86_64",
    "python": "3.11.2",
    "python_venv": "yes",
    "systemctl": "yes",
    "systemd_running": "yes",
    "disk_free_kb": str(20 * 2**20),
    "nvidia_driver": "550.90.07",
    "nvidia_gpus": "8",
}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("gpu1", HostSpec("gpu1")),
        ("ops@gpu1:2222", HostSpec("gpu1", "ops", 2222)),
        ("10.0.0.5:22", HostSpec("10.0.0.5", None, 22)),
        ("root@[fd00::5]:2200", HostSpec("fd00::5", "root", 2200)),
    ],
)
def test_host_specs_parse_user_host_and_port(text, expected):
    assert HostSpec.parse(text) == expected
    assert HostSpec.parse(str(expected)) == expected


@pytest.mark.parametrize("text", ["", "a b", "host:99999", "user@", "@host"])
def test_bad_host_specs_are_refused(text):
    with pytest.raises(ValueError):
        HostSpec.parse(text)


def test_unknown_host_key_is_refused_and_nothing_is_recorded(tmp_path):
    known = tmp_path / "known_hosts"
    key = (
        paramiko.Ed25519Key.generate()
        if hasattr(paramiko.Ed25519Key, "generate")
        else paramiko.RSAKey.generate(1024)
    )
    client = paramiko.SSHClient()
    with pytest.raises(HostKeyRejected, match=r"not in .*known_hosts.*--accept-new-host-keys"):
        StrictHostKeyPolicy(known).missing_host_key(client, "[10.0.0.9]:2222", key)
    assert not known.exists()
    assert client.get_host_keys().lookup("[10.0.0.9]:2222") is None


def test_accept_new_host_keys_records_the_key_once_per_host(tmp_path):
    known = tmp_path / "ssh" / "known_hosts"
    key = paramiko.RSAKey.generate(1024)
    client = paramiko.SSHClient()
    policy = StrictHostKeyPolicy(known, accept_new=True, lock=threading.Lock())
    policy.missing_host_key(client, "gpu7", key)
    assert known.read_text() == f"gpu7 ssh-rsa {key.get_base64()}\n"
    assert oct(known.stat().st_mode & 0o777) == "0o600"
    loaded = paramiko.HostKeys(str(known))
    assert loaded.lookup("gpu7")["ssh-rsa"] == key
    assert fingerprint(key).startswith("SHA256:")


def test_preflight_passes_a_good_host_and_states_the_driver():
    problems, verdict = judge_preflight(GOOD_FACTS, BootstrapOptions())
    assert problems == []
    assert (
        verdict.startswith("ok (")
        and "Python 3.11.2" in verdict
        and "NVIDIA driver 550.90.07 (8 GPU(s))" in verdict
    )


def test_preflight_says_cpu_only_when_there_is_no_driver():
    problems, verdict = judge_preflight(
        dict(GOOD_FACTS, nvidia_driver="", nvidia_gpus=""), BootstrapOptions()
    )
    assert problems == [] and "CPU-only" in verdict


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"python": "3.9.18"}, "Python 3.9.18 < 3.10"),
        ({"python": ""}, "no python3 on the host"),
        ({"python_venv": "no"}, "no venv module"),
        ({"uid": "1000"}, "not root (uid 1000): use --sudo"),
        ({"systemctl": "no"}, "no systemd"),
        ({"disk_free_kb": "1024"}, "only 1 MiB free"),
        (
            {
                "fleetd_reachable": "",
                "fleetd_unreachable": "http://127.0.0.1:8080: [Errno 111] Connection refused",
            },
            "the host cannot reach fleetd at http://127.0.0.1:8080: http://127.0.0.1:8080: [Errno "
            "111] Connection refused (is --server-url the URL the hosts reach fleetd at?)",
        ),
    ],
)
def test_preflight_fails_with_a_readable_reason(change, reason):
    problems, verdict = judge_preflight(
        dict(GOOD_FACTS, **change), BootstrapOptions(server_url="http://127.0.0.1:8080")
    )
    assert any(reason in p for p in problems), problems
    assert verdict.startswith("FAILED: ")


def test_facts_without_the_marker_are_a_host_failure():
    with pytest.raises(HostFailed, match="printed nothing usable"):
        parse_facts("sh: 1: syntax error\n")


def test_bundle_compatibility_follows_the_wheel_tags():
    wheels = [
        "fleetd-0.1.0-py3-none-any.whl",
        "pyyaml-6.0.2-cp311-cp311-manylinux_2_17_x86_64.whl",
        "cryptography-43.0.0-cp39-abi3-manylinux_2_28_aarch64.whl",
        "cryptography-43.0.0-cp39-abi3-manylinux_2_28_x86_64.whl",
    ]
    assert check_host_compat(wheels, "3.11.4", "x86_64") == ""
    assert "pyyaml" in check_host_compat(wheels, "3.12.1", "x86_64")
    assert "pyyaml" in check_host_compat(wheels, "3.11.4", "aarch64")
    assert "cryptography" not in check_host_compat(wheels, "3.12.1", "aarch64")


def _bundle_with(path, members):
    """A bundle tarball of `members`: {name: bytes, or None for a directory}."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("directory", ["manifest.json", "wheels/a-1-py3-none-any.whl"])
def test_a_bundle_whose_manifest_or_wheel_is_no_regular_file_is_refused_with_a_bundle_error(
    tmp_path, directory
):
    top = "fleet-agent-bundle-1.0"
    manifest = json.dumps(
        {"format": 1, "version": "1.0", "wheels": {"a-1-py3-none-any.whl": "0" * 64}}
    ).encode()
    members = {f"{top}/manifest.json": manifest, f"{top}/wheels/a-1-py3-none-any.whl": b"wheel"}
    members[f"{top}/{directory}"] = None
    with pytest.raises(BundleError, match=f"{top}/{directory} is not a regular file"):
        read_bundle(_bundle_with(tmp_path / "bundle.tar.gz", members))


class FakeClient:
    """fleetd as a script: GET answers the next node in `states`; POSTs are recorded."""

    def __init__(self, states):
        self.states = list(states)
        self.posts = []
        self.gets = 0

    def get(self, path):
        self.gets += 1
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def post(self, path, body=None):
        self.posts.append(path.rsplit("/", 1)[1])
        return {}


def node(status, heartbeat="t1"):
    return {"id": "n1", "status": status, "last_heartbeat_at": heartbeat, "gpus": []}


def bootstrapper(client):
    from fleetd.provision.bootstrap import Bootstrapper, HostResult

    b = Bootstrapper(client, BootstrapOptions(wait_timeout=5), None, sleep=lambda s: None)
    return b, HostResult(host="h", node_id="n1")


def test_after_an_upgrade_fleetd_is_told_it_ended_and_the_node_is_ready():
    client = FakeClient([node("drained", "t2"), node("ready", "t2")])
    b, result = bootstrapper(client)
    assert b._wait_ready(result, node("drained", "t1"), True, "ready")["status"] == "ready"
    assert client.posts == ["end"]


def test_a_cordoned_node_goes_back_to_cordoned_at_the_end_of_its_upgrade_without_an_undrain():
    client = FakeClient([node("drained", "t2"), node("cordoned", "t2")])
    b, result = bootstrapper(client)
    assert b._wait_ready(result, node("drained", "t1"), True, "cordoned")["status"] == "cordoned"
    assert client.posts == ["end"]


def test_a_node_an_operator_drained_stays_drained_and_is_not_undrained():
    client = FakeClient([node("drained", "t2")])
    b, result = bootstrapper(client)
    assert b._wait_ready(result, node("drained", "t1"), False, "drained")["status"] == "drained"
    assert client.posts == []


def test_waiting_gives_up_with_the_node_status_and_reason():
    client = FakeClient([dict(node("lost", "t2"), status_reason="no heartbeat for 40s")])
    b, result = bootstrapper(client)
    b.clock = iter(range(0, 10_000, 3)).__next__
    with pytest.raises(
        HostFailed, match=r"not ready after 5s: it is lost \(no heartbeat for 40s\)"
    ):
        b._wait_ready(result, None, False, "ready")


@pytest.mark.parametrize(
    "status, reason, said",
    [
        (
            "failed_validation",
            "pcie_link GPU 0",
            r"failed_validation \(pcie_link GPU 0\).*validate",
        ),
        ("drained", "health policy: XID 79", r"drained \(health policy: XID 79\)"),
        ("revoked", "revoked by admin", r"revoked.*new join token"),
    ],
)
def test_waiting_for_ready_stops_at_once_where_the_node_will_not_get_there(status, reason, said):
    client = FakeClient([node("validating", "t2"), dict(node(status, "t2"), status_reason=reason)])
    b, result = bootstrapper(client)
    b.clock = iter(range(0, 10_000)).__next__  # a minute of polls allowed: it stops at the second
    b.options.wait_timeout = 60
    with pytest.raises(HostFailed, match=said):
        b._wait_ready(result, None, False, "ready")
    assert client.gets == 2  # the poll that saw it, not a minute of them


def test_bootstrap_options_take_one_url_or_several():
    assert BootstrapOptions(server_url="https://cp1:8443/").server_urls == ["https://cp1:8443"]
    options = BootstrapOptions(server_url=["https://cp1:8443", "https://cp2:8443"])
    assert options.template_values()["fleet_agent_server_url"] == [
        "https://cp1:8443",
        "https://cp2:8443",
    ]


class NodeClient:
    def get(self, path):
        return {"id": path.rsplit("/", 1)[1], "status": "ready", "fleet": "lab"}


@pytest.mark.parametrize(
    "stored, stored_list, wanted, same_node",
    [
        ("https://cp1:8443", "", ["https://cp1:8443"], True),  # an older agent, the same URL
        ("https://cp1:8443", "", ["https://cp1:8443", "https://cp2:8443"], True),  # a replica added
        (
            "https://cp1:8443",
            "https://cp1:8443,https://cp2:8443",
            ["https://CP2:8443/"],
            True,
        ),  # one removed
        (
            "https://old:8443",
            "",
            ["https://cp1:8443", "https://cp2:8443"],
            False,
        ),  # another fleetd: enrol again
        ("https://a:1", "https://a:1,https://b:2", ["https://c:3"], False),
        ("", "", ["https://cp1:8443"], True),
    ],
)
def test_a_host_enrols_again_only_when_its_stored_urls_share_none_with_the_new_ones(
    stored, stored_list, wanted, same_node
):
    from fleetd.provision.bootstrap import Bootstrapper

    b = Bootstrapper(NodeClient(), BootstrapOptions(server_url=wanted, fleet="lab"), None)
    node = b._enrolled_node(
        {"node_id": "n1", "node_server_url": stored, "node_server_urls": stored_list}
    )
    assert (node is not None) == same_node


def test_bootstrap_cli_takes_repeated_and_comma_separated_server_urls_and_refuses_a_bad_one(
    monkeypatch,
):
    from click.testing import CliRunner

    from fleetd.provision import cli as provision_cli

    seen = []

    class Recorder:
        def __init__(self, client, options, ssh_options, progress=None):
            seen.append(options)

        def run(self, specs, parallel=10, remove=False):
            return []

    monkeypatch.setattr(provision_cli.bs, "Bootstrapper", Recorder)
    args = ["gpu1", "--remove", "--url", "http://admin:1", "--token", "fla_x"]
    result = CliRunner().invoke(
        provision_cli.bootstrap,
        args
        + [
            "--server-url",
            "https://cp1:8443,https://cp2:8443",
            "--server-url",
            "https://cp3:8443/",
        ],
    )
    assert result.exit_code == 0, result.output
    assert seen[-1].server_url == ["https://cp1:8443", "https://cp2:8443", "https://cp3:8443"]
    result = CliRunner().invoke(
        provision_cli.bootstrap, args, env={"FLEETD_AGENT_SERVER_URL": "https://a:1 https://b:2"}
    )
    assert result.exit_code == 0 and seen[-1].server_url == ["https://a:1", "https://b:2"]
    result = CliRunner().invoke(provision_cli.bootstrap, args)
    assert result.exit_code == 0 and seen[-1].server_url == [
        "http://admin:1"
    ]  # --url, when none is given
    result = CliRunner().invoke(
        provision_cli.bootstrap, args + ["--server-url", "https://cp1:8443,cp2"]
    )
    assert result.exit_code == 2 and "'cp2' must start with http:// or https://" in result.output


def test_a_failed_command_shows_its_cause_before_an_earlier_warning():
    from fleetd.provision.bootstrap import first_cause

    text = (
        "WARNING: NVML could not be loaded (libnvidia-ml.so.1: cannot open shared object file)\n"
        "error: cannot reach fleetd at http://127.0.0.1:8080: connection refused\n"
    )
    shown = first_cause(text)
    assert shown.startswith(
        "error: cannot reach fleetd at http://127.0.0.1:8080: connection refused"
    )
    assert "NVML" in shown  # still there, after the cause
    assert first_cause("") == "(no output)"


class _Bundle:
    def __init__(self, version, sha256="b" * 64):
        from pathlib import Path

        self.version, self.sha256, self.path = (
            version,
            sha256,
            Path(f"fleet-agent-bundle-{version}.tar.gz"),
        )


@pytest.mark.parametrize(
    "installed, sha, bundle, allow, expected",
    [
        ("", "", "0.2.0", False, (True, False)),  # fresh host: install, no upgrade
        ("0.2.0", "b" * 64, "0.2.0", False, (False, False)),  # this very bundle: nothing
        ("0.2.0", "a" * 64, "0.2.0", False, (True, True)),  # rebuilt, same version: upgrade
        ("0.2.0", "", "0.2.0", False, (True, True)),  # installed before SHA-256s were recorded
        ("0.1.0", "a" * 64, "0.2.0", False, (True, True)),
        ("0.2.0.post1", "a" * 64, "0.2.0", True, (True, True)),
        ("0.10.0", "a" * 64, "0.9.0", True, (True, True)),
    ],
)
def test_install_plan_compares_version_and_sha256(installed, sha, bundle, allow, expected):
    from fleetd.provision.bootstrap import install_plan

    facts = {"installed_version": installed, "installed_sha256": sha}
    assert install_plan(facts, _Bundle(bundle), allow) == expected


@pytest.mark.parametrize(
    "installed, bundle",
    [("0.2.0", "0.1.0"), ("0.10.0", "0.9.0"), ("0.1.0.post1", "0.1.0"), ("1.0.0", "1.0.0rc1")],
)
def test_a_downgrade_is_refused_with_the_flag_that_allows_it(installed, bundle):
    from fleetd.provision.bootstrap import install_plan

    with pytest.raises(
        HostFailed,
        match=rf"refusing to downgrade fleet-agent {installed} to {bundle}.*--allow-downgrade",
    ):
        install_plan(
            {"installed_version": installed, "installed_sha256": "a" * 64}, _Bundle(bundle)
        )


def test_a_long_reason_wraps_instead_of_widening_every_row(capsys):
    from fleetd.provision.bootstrap import HostResult
    from fleetd.provision.cli import REASON_WIDTH, _show_results

    long = "fleet-agent join failed (exit 1): " + "a very long explanation " * 20
    _show_results(
        [
            HostResult(host="gpu-01", result="failed", reason=long),
            HostResult(
                host="gpu-02", result="unchanged", node_id="n2", gpus=8, reason="already installed"
            ),
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 60 + REASON_WIDTH, lines
    short_row = next(line for line in lines if line.strip().startswith("gpu-02"))
    assert len(short_row.rstrip()) < 80, short_row  # the short row is not padded to the long reason
    assert (
        sum("a very long explanation" in line for line in lines) > 3
    )  # wrapped over several lines


class _Refusing(FakeClient):
    def post(self, path, body=None):
        from fleetd.client import ClientError

        self.posts.append(path.rsplit("/", 1)[1])
        raise ClientError("node n1 is ready, not draining or drained", status=409)


def test_a_failed_upgrade_fleetd_refuses_to_record_is_said_in_the_reason():
    client = _Refusing([node("drained")])
    b, result = bootstrapper(client)
    said = b._fail_upgrade("n1", "the agent did not start", result)
    assert said == (
        "node n1: fleetd did not take the failed upgrade (node n1 is ready, not draining or "
        "drained)"
    )
    assert client.posts == ["end"]


def test_a_run_that_fleetd_will_not_record_is_noted_in_its_row_and_still_stands():
    client = _Refusing([node("ready")])
    b, _ = bootstrapper(client)

    def work(spec, result):
        result.node_id, result.result, result.reason = "n1", "updated", "labels changed"

    result = b._guarded(work, "h", record=True)
    assert (result.result, result.node_id) == ("updated", "n1")
    assert result.reason.startswith(
        "labels changed; this run was not recorded on node n1 (node n1 is ready"
    )
    assert client.posts == ["events"]
    assert b._guarded(work, "h", record=False).reason == "labels changed"  # removals record nothing

    def nothing(spec, result):
        result.node_id, result.result, result.reason = "n1", "unchanged", "already installed"

    client.posts.clear()
    result = b._guarded(nothing, "h", record=True)  # a rerun that changed nothing is no event
    assert result.reason == "already installed" and client.posts == []
