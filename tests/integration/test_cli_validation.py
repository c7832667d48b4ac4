"""The validation gate and GPU history through the CLI against a real server: `fleet create` gates
the fleet and says so, `node validate` waits for and prints the results, `node drain --repair`,
`gpu show` and `gpu rma`. The node is a stand-in that answers the validation by hand (real agents:
tests/agent/test_validation_e2e.py)."""

import json

import pytest
import requests

from tests.conftest import gpus
from tests.integration.test_cli import run  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def _agent(url, path, body, headers):
    resp = requests.post(
        url + path, json=body, timeout=30, headers={"X-Fleet-Protocol": "1", **headers}
    )
    assert resp.status_code < 300, resp.text
    return resp.json() if resp.content else None


def _answer(url, session, checks):
    """One heartbeat; the validation it carries is answered with `checks`."""
    validation = _agent(url, "/api/v1/agent/heartbeat", {}, session)["validation"]
    _agent(url, f"/api/v1/agent/validations/{validation['id']}", {"checks": checks}, session)


def test_the_gate_and_gpu_history_through_the_cli(run):
    created = run("fleet", "create", "gpu-a").stdout
    assert (
        "created fleet gpu-a; validation: new and repaired nodes must pass: built-in checks"
        in created
    )
    assert "VALIDATION" in run("fleet", "show", "gpu-a").stdout
    token = json.loads(run("join-token", "create", "--fleet", "gpu-a", "--json").stdout)["token"]
    reported = [dict(g, serial=f"SN-{g['index']}") for g in gpus(2)]
    reg = _agent(
        run.url,
        "/api/v1/agent/register",
        {
            "hostname": "h1",
            "machine_id": "m1",
            "agent_version": "0.1",
            "address": "127.0.0.1",
            "resources": {"cpu_count": 8, "memory_bytes": 2**35},
            "gpus": reported,
        },
        {"Authorization": f"Bearer {token}"},
    )
    session = {"Authorization": f"Bearer {reg['session_token']}"}
    _answer(
        run.url,
        session,
        [
            {
                "name": "pcie_link",
                "gpu": 1,
                "status": "failed",
                "detail": "degraded PCIe link: max link width x8, expected x16",
            }
        ],
    )
    listed = run("node", "list", "--status", "failed_validation").stdout
    assert "h1" in listed and "pcie_link GPU 1 (serial SN-1)" in listed
    shown = run("node", "show", "h1").stdout
    assert "pcie_link" in shown and "GPU 1 (SN-1)" in shown and "failed" in shown

    # Validate again: the command waits for the stand-in's answer (given before it looks) and prints
    # it.
    proc = run("node", "validate", "h1", "--no-wait")
    assert "validating node" in proc.stdout
    _answer(
        run.url,
        session,
        [{"name": "pcie_link", "gpu": 1, "status": "passed", "detail": "link max Gen5 x16"}],
    )
    assert json.loads(run("node", "show", "h1", "--json").stdout)["status"] == "ready"

    shown = run("gpu", "show", "SN-1").stdout
    assert "h1" in shown and "gpu.validation" in shown and "degraded PCIe link" in shown
    assert "drained for repair" in run("gpu", "rma", "SN-1", "--reason", "flaky link").stdout
    assert "for repair: undrain validates it" in run("node", "show", "h1").stdout
    assert "now validating" in run("node", "undrain", "h1").stdout
    _answer(run.url, session, [{"name": "pcie_link", "gpu": 1, "status": "passed", "detail": "ok"}])
    node = json.loads(run("node", "show", "h1", "--json").stdout)
    assert (
        node["status"] == "failed_validation"
        and "serial SN-1 is marked for RMA: flaky link" in node["status_reason"]
    )  # the marked board is still in the node
    assert "fleetd: not_found" in run("gpu", "show", "nope", expect=1).stderr
    marked = run("gpu", "list", "--state", "rma").stdout
    assert "SN-1" in marked and "flaky link" in marked and "SN-0" not in marked
    assert "RMA mark cleared" in run("gpu", "clear-rma", "SN-1").stdout
    assert json.loads(run("gpu", "list", "--state", "rma", "--json").stdout) == []

    # Every key of the setting has its option; the API's own schema checks them before anything is
    # sent.
    updated = json.loads(
        run(
            "fleet",
            "update",
            "gpu-a",
            "--validation-check",
            "pcie_link",
            "--validation-check",
            "driver_version",
            "--driver-version",
            "550.54.15",
            "--cuda-version",
            "12.4",
            "--mig-mode",
            "disabled",
            "--expected-gpus",
            "8",
            "--max-temperature",
            "80",
            "--pcie-width",
            "8",
            "--validation-command",
            "/opt/burn/run -g 8",
            "--validation-timeout",
            "20m",
            "--validation-command-as-root",
            "--dcgm-level",
            "0",
            "--json",
        ).stdout
    )
    assert updated["validation"] == {
        "checks": ["pcie_link", "driver_version"],
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
        "mig_mode": "disabled",
        "expected_gpus": 8,
        "max_temperature_c": 80,
        "pcie_width": 8,
        "command": ["/opt/burn/run", "-g", "8"],
        "timeout_seconds": 1200,
        "command_as_root": True,
        "dcgm_level": 0,
    }
    shown = run("fleet", "show", "gpu-a").stdout
    assert (
        "8 GPUs, driver 550.54.15, CUDA 12.4, MIG disabled, idle below 80 °C, PCIe x8" in shown
    ), shown
    assert "(limit 1200 s, as root)" in shown, shown
    bad = run(
        "fleet",
        "update",
        "gpu-a",
        "--validation-check",
        "nope",
        "--max-temperature",
        "500",
        expect=2,
    ).stderr
    assert "--validation-check: Must be one of:" in bad and "--max-temperature: Must be" in bad, bad
    assert (
        json.loads(run("fleet", "show", "gpu-a", "--json").stdout)["validation"]
        == updated["validation"]
    )
