"""The validation gate and GPU history with real processes: `fleetd serve` and `fleet-agent run` on
fake GPUs (a degraded PCIe link, pending row remaps, a healthy host), and a GPU board moved to
another host."""

import json

import pytest

from tests.agent.conftest import Http, rewrite_shape, wait_until

pytestmark = pytest.mark.integration

FAST = {"FLEETD_HEARTBEAT_INTERVAL_SECONDS": "1"}
BURN_IN = ["sh", "-c", "echo burn-in ok; id -un"]


def _with_serials(prefix):
    def change(shape):
        for gpu in shape["gpus"]:
            gpu.update(
                serial=f"{prefix}{gpu['uuid'][-4:]}",
                board_part_number="699-2G520-0200-000",
                vbios="96.00.74.00.01",
                uuid=f"{gpu['uuid'][:-8]}{prefix[:4]}{gpu['uuid'][-4:]}",
            )

    return change


def _node(http, agent):
    return http("GET", f"/api/v1/nodes/{agent.node()['node_id']}", expect=200).json()


def _settled(http, agent, statuses=("ready", "failed_validation")):
    return wait_until(
        lambda: (lambda n: n if n["status"] in statuses else None)(_node(http, agent)),
        timeout=60,
        interval=0.2,
        message=f"node {agent.name} to finish validating",
        details=lambda: agent.log[-2000:],
    )


def _start(agent, server, token, change=None):
    if change is not None:
        rewrite_shape(agent.shape, change)
    agent.join(token, server.url)
    return agent.start()


def test_a_degraded_pcie_link_or_pending_row_remaps_fail_validation_by_name_a_healthy_host_passes(
    server_factory, admin, agent_factory
):
    server = server_factory(**FAST)
    http = Http(server.url, admin)
    http.create_root_fleet("lab", validation={"command": BURN_IN, "timeout_seconds": 60})
    token = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 3}).json()[
        "token"
    ]

    def degraded(shape):
        _with_serials("SLOW")(shape)
        shape["gpus"][3]["pcie"] = dict(shape["gpus"][3]["pcie"], max_width=8)

    def remaps(shape):
        _with_serials("REMP")(shape)
        shape["gpus"][1]["remapped_rows"] = {
            "correctable": 0,
            "uncorrectable": 2,
            "pending": True,
            "failure": False,
        }

    healthy = _start(agent_factory("healthy"), server, token, _with_serials("GOOD"))
    slow = _start(agent_factory("slow-link"), server, token, degraded)
    remapped = _start(agent_factory("remapped"), server, token, remaps)

    node = _settled(http, healthy)
    assert node["status"] == "ready", node["status_reason"]
    result = http("GET", f"/api/v1/nodes/{node['id']}/validation", expect=200).json()
    assert result["state"] == "passed"
    by_name = {}
    for check in result["checks"]:
        by_name.setdefault(check["name"], []).append(check)
    assert (
        len(by_name["pcie_link"]) == 8
        and "now Gen1 x16 (an idle link trains down)" in by_name["pcie_link"][0]["detail"]
    )
    assert by_name["clocks_throttle"][0]["status"] == "passed"  # the idle reason is not a slowdown
    assert by_name["dcgm"][0]["status"] == "skipped"  # no DCGM here
    assert (
        by_name["command"][0]["status"] == "passed"
        and "burn-in ok" in by_name["command"][0]["output"]
    )
    assert (
        by_name["command"][0]["output"].split()[-1] != "root"
    )  # the fleet's command runs unprivileged
    assert by_name["pcie_link"][0]["serial"] == node["gpus"][0]["serial"] == "GOOD0000"

    node = _settled(http, slow)
    assert node["status"] == "failed_validation"
    assert (
        "pcie_link GPU 3 (serial SLOW0003): degraded PCIe link: max link width x8, expected x16"
        in node["status_reason"]
    )
    node = _settled(http, remapped)
    assert node["status"] == "failed_validation"
    assert "row_remap GPU 1 (serial REMP0001): remapped rows pending" in node["status_reason"]
    assert "pcie_link" not in node["status_reason"]

    # The row remap is done (a GPU reset): the operator validates again and the node passes.
    rewrite_shape(
        remapped.shape,
        lambda s: s["gpus"][1].update(
            remapped_rows={"correctable": 0, "uncorrectable": 2, "pending": False, "failure": False}
        ),
    )
    http("POST", f"/api/v1/nodes/{node['id']}/validate", expect=200)
    assert _settled(http, remapped, ("ready",))["status"] == "ready"


def test_a_gpu_serial_moved_to_another_host_keeps_its_history_and_an_rma_mark_flags_it_there(
    server_factory, admin, agent_factory
):
    server = server_factory(**FAST)
    http = Http(server.url, admin)
    http.create_root_fleet("lab")
    token = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={"max_uses": 2}).json()[
        "token"
    ]
    rediscover = {
        "FLEET_AGENT_DEVICES_REDISCOVER_SECONDS": "1"
    }  # a swapped board is seen at NVML's next init
    first = _start(agent_factory("first", env=rediscover), server, token, _with_serials("AAAA"))
    second = _start(agent_factory("second", env=rediscover), server, token, _with_serials("BBBB"))
    for agent in (first, second):
        wait_until(
            lambda a=agent: _node(http, a)["status"] == "ready",
            timeout=60,
            interval=0.2,
            message=f"{agent.name} ready",
        )
    serial = "AAAA0002"
    http("POST", f"/api/v1/gpus/{serial}/rma", expect=200, json={"reason": "XID 79 in training"})
    assert wait_until(
        lambda: _node(http, first)["status"] == "drained",
        timeout=30,
        interval=0.2,
        message="first drained for repair",
    )
    assert _node(http, first)["drain"]["repair"] is True

    # The board is swapped: out of the first host, into the second one's slot 5 (the fake reads the
    # shape again).
    board = json.loads(first.shape.read_text())["gpus"][2]
    rewrite_shape(
        first.shape,
        lambda s: s["gpus"][2].update(serial="CCCC0002", uuid=board["uuid"][:-8] + "CCCC0002"),
    )
    rewrite_shape(second.shape, lambda s: s["gpus"][5].update(serial=serial, uuid=board["uuid"]))
    moved = wait_until(
        lambda: (lambda g: g if g["node_id"] == second.node()["node_id"] else None)(
            http("GET", f"/api/v1/gpus/{serial}", expect=200).json()
        ),
        timeout=60,
        interval=0.2,
        message="the board seen in the second host",
        details=lambda: second.log[-1500:],
    )
    assert moved["hostname"] and "seen again in node" in moved["flagged"]
    assert moved["healthy"] is False and moved["rma"]["reason"] == "XID 79 in training"
    history = [(e["kind"], e["reason"]) for e in moved["history"]]
    kinds = [k for k, _ in history]
    assert kinds[0] == "gpu.seen" and first.node()["node_id"] in history[0][1]
    assert "gpu.rma" in kinds and kinds.index("gpu.rma") < kinds.index("gpu.flagged")
    # It left the first host (that host said so first, or the second one saw it while it was still
    # listed there).
    assert any(
        k == "gpu.seen"
        and (
            f"no longer in node {first.node()['node_id']}" in r
            or f"was in node {first.node()['node_id']}" in r
        )
        for k, r in history
    )
    assert any(k == "gpu.seen" and f"in node {second.node()['node_id']}" in r for k, r in history)
    gpus = {g["serial"]: g for g in _node(http, second)["gpus"]}
    assert gpus[serial]["health_reason"].startswith("marked for RMA") and gpus[serial]["index"] == 5
