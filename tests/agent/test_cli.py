"""`fleet-agent devices`, `status` and `join` without a running agent."""

import json

import requests
from click.testing import CliRunner

from agent.cli import cli
from tests.support.http import register_body


def config_file(tmp_path, backend):
    path = tmp_path / "agent.toml"
    path.write_text(
        f'state_dir = "{tmp_path / "state"}"\nmachine_id = "cli-1"\n[local_api]\n'
        f'listen = "127.0.0.1:9"\n[devices]\nbackend = "fake:{backend}"\n'
    )
    return str(path)


def test_devices_lists_gpus_like_nvidia_smi_and_names_the_lost_one(tmp_path, fake_nvml):
    config = config_file(tmp_path, fake_nvml.use("gpu_lost"))
    result = CliRunner().invoke(cli, ["devices", "--config", config])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("GPU ")]
    assert len(lines) == 4
    assert lines[0].startswith(
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5f3c6b1e-7a1d-4c2e-9b0f-000000000000) 80 GiB"
    )
    assert "UNHEALTHY: GPU 2 unavailable: GPU is lost" in lines[2]


def test_devices_json_has_driver_details_and_mig_instances(tmp_path, fake_nvml):
    config = config_file(tmp_path, fake_nvml.use("a100_mig_x2"))
    result = CliRunner().invoke(cli, ["devices", "--json", "--config", config])
    data = json.loads(result.output)
    assert data["driver_version"] == "535.161.08" and data["cuda_version"] == "12.2"
    assert [len(g["mig_devices"]) for g in data["gpus"]] == [3, 1]


def test_devices_on_a_host_without_driver_says_so(tmp_path, fake_nvml):
    config = config_file(tmp_path, fake_nvml.use("no_driver"))
    result = CliRunner().invoke(cli, ["devices", "--config", config])
    assert result.exit_code == 0
    assert "no GPUs: no NVIDIA driver" in result.output


def test_status_before_join_says_not_enrolled_and_not_running(tmp_path, fake_nvml):
    config = config_file(tmp_path, fake_nvml.use("l4_x4"))
    result = CliRunner().invoke(cli, ["status", "--json", "--config", config])
    data = json.loads(result.output)
    assert data["node"] is None and data["session"] == "missing"
    assert data["agent"]["running"] is False
    assert len(data["devices"]["gpus"]) == 4


def test_join_without_server_url_or_with_unreachable_fleetd_fails_clearly(tmp_path, fake_nvml):
    config = config_file(tmp_path, fake_nvml.use("l4_x4"))
    result = CliRunner().invoke(cli, ["join", "--token", "flj_x.y", "--config", config])
    assert result.exit_code == 2 and "no fleetd URL" in result.output
    result = CliRunner().invoke(
        cli, ["join", "--server", "http://127.0.0.1:9", "--token", "flj_x.y", "--config", config]
    )
    assert result.exit_code == 1 and "enrolment failed: fleetd unreachable" in result.output
    assert "flj_x.y" not in result.output


def test_join_in_a_storm_of_hosts_comes_back_when_fleetd_says(
    tmp_path, fake_nvml, server_factory, admin
):
    # fleetd admits a registration every 2 s; another host just took this turn
    server = server_factory(FLEETD_MAX_REGISTRATIONS_PER_SECOND="0.5")
    headers = {"Authorization": f"Bearer {admin}"}
    assert requests.post(
        f"{server.url}/api/v1/fleets", json={"name": "gpu-a"}, headers=headers, timeout=10
    ).ok
    join = requests.post(
        f"{server.url}/api/v1/fleets/gpu-a/join-tokens",
        json={"max_uses": 2},
        headers=headers,
        timeout=10,
    ).json()["token"]
    other = register_body("other-1", "other")
    agent_headers = {"Authorization": f"Bearer {join}", "X-Fleet-Protocol": "1"}
    first = requests.post(
        f"{server.url}/api/v1/agent/register", json=other, headers=agent_headers, timeout=10
    )
    assert first.status_code == 201, first.text
    refused = requests.post(
        f"{server.url}/api/v1/agent/register",
        json=dict(other, machine_id="other-2"),
        headers=agent_headers,
        timeout=10,
    )
    assert refused.status_code == 429 and refused.headers["Retry-After"] in ("1", "2")
    assert refused.json()["error"]["code"] == "rate_limited"
    config = config_file(tmp_path, fake_nvml.use("l4_x4"))
    result = CliRunner().invoke(
        cli, ["join", "--server", server.url, "--token", join, "--config", config]
    )
    assert result.exit_code == 0, result.output
    assert "enrolled as node" in result.output
    assert "fleetd is busy admitting hosts (fleetd answered 429 rate_limited" in result.output
    nodes = requests.get(f"{server.url}/api/v1/nodes", headers=headers, timeout=10).json()
    assert sorted(n["hostname"] for n in nodes["items"])[0] == "other"
    assert len(nodes["items"]) == 2
