"""The validation gate: a node proves its GPUs before it takes work.

A fleet's `validation` setting (None: no gate; {} the built-in checks) says what a node must pass.
A node validates when it joins a gated fleet (pending -> validating at its first heartbeat), when an
operator undrains it after a drain for repair (`repair: true`, any fleet), and when an operator asks
(POST /nodes/{id}/validate). While `validating` it takes no work: its agent reads the suite from the
heartbeat's answer, runs it (agent/validation.py) and posts the results; the node then goes where it
was headed (`then_status`: ready, or back to cordoned or drained), or to `failed_validation` with a
reason that names each failing check and GPU. A suite with no result by its deadline fails.

Each run is one Validation row; its GPUs' verdicts go to their history (services.nodes.gpu_history).
"""

import collections
import datetime as dt

from fleetd.db import write_transaction
from fleetd.errors import Conflict, NotFound
from fleetd.models import Gpu, Node, NodeStatus, Task, Validation, new_id
from fleetd.services.fleet_ops.fleets import fleet_column
from fleetd.services.nodes import gpu_history
from fleetd.services.nodes.mig_layout import mig_layout_checks
from fleetd.services.notify.events import current_actor, record_event
from fleetd.services.placement.parking import node_changed
from fleetd.services.workloads.lifecycle import ACTIVE_TASK_STATES
from fleetd.services.workloads.node_status import switch_node_status

# The built-in checks, in the order the agent runs them (docs/validation.md).
BUILTIN_CHECKS = (
    "gpus_present",
    "gpu_health",
    "driver_version",
    "cuda_version",
    "persistence_mode",
    "ecc_mode",
    "retired_pages",
    "row_remap",
    "ecc_errors",
    "pcie_link",
    "clocks_throttle",
    "temperature",
    "mig_mode",
    "dcgm",
)
COMMAND_CHECK = "command"
STATES = ("running", "passed", "failed")
RESULT_STATUSES = ("passed", "failed", "not_supported", "skipped")

DEFAULT_DCGM_LEVEL = 1
DEFAULT_TIMEOUT_SECONDS = 600  # the fleet's command
DEFAULT_MAX_TEMPERATURE_C = 85
DCGM_SECONDS = {0: 0, 1: 120, 2: 600, 3: 1800, 4: 7200}  # how long `dcgmi diag -r N` may take
MARGIN_SECONDS = 300  # beyond the suite's own budget, before fleetd gives up on a result
REASON_MAX = 1000
DETAIL_MAX = 1000


def fleet_setting(fleet_id):
    """The fleet's validation setting (None: no gate)."""
    return fleet_column(fleet_id, "validation")


def prevailing_versions(fleet_id, node_id):
    """{driver_version, cuda_version} most common among the latest passed validations of the
    fleet's other nodes (None where there is none)."""
    others = [
        n.id
        for n in Node.select(Node.id)
        .where((Node.fleet == fleet_id) & (Node.id != node_id))
        .limit(1000)
    ]
    latest = {}
    for start in range(0, len(others), 500):
        for row in (
            Validation.select(Validation.node_id, Validation.system)
            .where(
                Validation.node_id.in_(others[start : start + 500]) & (Validation.state == "passed")
            )
            .order_by(Validation.id)
        ):
            latest[row.node_id] = row.system or {}
    out = {}
    for key in ("driver_version", "cuda_version"):
        counts = collections.Counter(s.get(key) for s in latest.values() if s.get(key))
        out[key] = counts.most_common(1)[0][0] if counts else None
    return out


def resolve_suite(node, setting):
    """What the node's agent is asked to run: the fleet's setting (None or {}: the built-ins) with
    its defaults and expectations filled in."""
    setting = dict(setting or {})
    checks = [c for c in (setting.get("checks") or BUILTIN_CHECKS) if c in BUILTIN_CHECKS]
    expected = setting.get("expected_gpus")
    if (
        expected is None
    ):  # as many as it reports, and never fewer than its last passed validation found
        expected = max(Gpu.select().where(Gpu.node == node.id).count(), _last_passed_count(node.id))
    prevailing = prevailing_versions(node.fleet_id, node.id)
    return {
        "checks": checks,
        "expected_gpus": expected,
        "driver_version": setting.get("driver_version") or prevailing["driver_version"],
        "driver_pinned": bool(setting.get("driver_version")),
        "cuda_version": setting.get("cuda_version") or prevailing["cuda_version"],
        "cuda_pinned": bool(setting.get("cuda_version")),
        "mig_mode": setting.get("mig_mode"),
        "max_temperature_c": setting.get("max_temperature_c") or DEFAULT_MAX_TEMPERATURE_C,
        "pcie_width": setting.get("pcie_width"),
        "dcgm_level": setting.get("dcgm_level", DEFAULT_DCGM_LEVEL),
        "command": setting.get("command"),
        "timeout_seconds": setting.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS,
        "command_as_root": bool(setting.get("command_as_root")),
    }


def _last_passed_count(node_id):
    """How many GPUs the node's latest passed validation expected (0: none passed): a GPU that fell
    off the bus since is missed, not forgotten."""
    row = (
        Validation.select(Validation.suite)
        .where((Validation.node_id == node_id) & (Validation.state == "passed"))
        .order_by(Validation.id.desc())
        .first()
    )
    return int((row.suite or {}).get("expected_gpus") or 0) if row is not None else 0


def _deadline(now, suite):
    budget = DCGM_SECONDS.get(suite.get("dcgm_level") or 0, 7200) + MARGIN_SECONDS
    if suite.get("command"):
        budget += suite["timeout_seconds"]
    return now + dt.timedelta(seconds=budget)


def latest_validation(node_id):
    """The node's most recent Validation, or None."""
    return (
        Validation.select()
        .where(Validation.node_id == node_id)
        .order_by(Validation.id.desc())
        .first()
    )


def start_validation(rt, node, now, reason, then_status, setting=None, actor=None):
    """Inside the caller's transaction: a new Validation of the node, which becomes `validating`
    (it takes no work until the suite passes, then goes to `then_status`). A validation still
    running is superseded. Returns the Validation."""
    running = latest_validation(node.id)
    if running is not None and running.state == "running":
        running.state, running.finished_at = "failed", now
        running.checks = [
            {
                "name": "superseded",
                "gpu": None,
                "status": "failed",
                "passed": False,
                "detail": "a new validation of the node replaced this one",
            }
        ]
        running.save()
    suite = resolve_suite(node, setting if setting is not None else fleet_setting(node.fleet_id))
    actor = actor or current_actor()
    row = Validation.create(
        id=new_id(),
        node_id=node.id,
        state="running",
        reason=reason[:REASON_MAX],
        suite=suite,
        then_status=then_status,
        started_at=now,
        deadline=_deadline(now, suite),
        actor=actor,
    )
    switch_node_status(
        rt, node, NodeStatus.VALIDATING, f"validating: {reason}"[:REASON_MAX], now, actor=actor
    )
    return row


def gate_first_heartbeat(rt, node, now):
    """Inside the heartbeat's transaction: a pending node's first heartbeat. In a gated fleet it
    validates, else it is ready at once. Returns True when it validates."""
    setting = fleet_setting(node.fleet_id)
    if setting is None:
        switch_node_status(rt, node, NodeStatus.READY, "first heartbeat", now)
        return False
    start_validation(
        rt,
        node,
        now,
        f"new node: fleet {node.fleet_id} validates nodes before they take work",
        NodeStatus.READY.value,
        setting,
    )
    return True


# Where an operator's validation leaves a node that passes, by the status it is asked in.
_RETURNS_TO = {
    "ready": "ready",
    "cordoned": "cordoned",
    "drained": "drained",
    "failed_validation": "ready",
}


def validate_node(rt, node_id):
    """An operator asks for a validation now: the node takes no new work until it passes, then
    returns to where it was (a ready node to ready, a cordoned or drained one stays so). Refused
    (409) while tasks run on it, while an upgrade of it that failed is open, and for a pending,
    draining, lost or revoked node."""
    now = rt.clock.now()
    with write_transaction():
        node = Node.get_or_none(Node.id == node_id)
        if node is None:
            raise NotFound(f"node {node_id} not found")
        if node.status == NodeStatus.VALIDATING.value:
            then = latest_validation(node_id)
            then_status = then.then_status if then is not None else NodeStatus.READY.value
        elif node.status in _RETURNS_TO:
            then_status = _RETURNS_TO[node.status]
        else:
            raise Conflict(
                f"node {node_id} is {node.status}: only a ready, cordoned, drained, validating or "
                "failed_validation node can be validated",
                {"status": node.status},
            )
        upgrade = node.upgrade or {}
        if upgrade.get("failed"):  # an open failed upgrade: validating would hide it
            raise Conflict(
                f"node {node_id}'s upgrade ({upgrade.get('reason')}) failed and is still open: "
                "upgrade it again (fleetd node upgrade), or fix its agent and end the upgrade "
                '(POST /api/v1/nodes/{id}/upgrade/end {"outcome": "succeeded"}); a validation '
                "now would put the node back in service with its agent as the upgrade left it",
                {"status": node.status, "upgrade": upgrade},
            )
        running = (
            Task.select().where((Task.node == node_id) & Task.state.in_(ACTIVE_TASK_STATES)).count()
        )
        if running:
            raise Conflict(
                f"node {node_id} runs {running} task(s): drain it first (a validation needs its "
                "GPUs idle)",
                {"status": node.status, "tasks": running},
            )
        start_validation(rt, node, now, f"requested by {current_actor()}", then_status)
    return node_id


def undrain_for_repair(rt, node, now):
    """Inside the undrain's transaction: a node drained for repair validates before it is ready
    (the built-in checks where its fleet has no gate). Conflict while tasks still run on it."""
    running = (
        Task.select().where((Task.node == node.id) & Task.state.in_(ACTIVE_TASK_STATES)).count()
    )
    if running:
        raise Conflict(
            f"node {node.id} was drained for repair and still runs {running} task(s): it is "
            "validated once they are done (wait for drained)",
            {"status": node.status, "tasks": running},
        )
    node.drain_reason = node.drain_deadline = node.drain_started_at = None
    node.drain_repair = False
    start_validation(
        rt,
        node,
        now,
        "back from repair",
        NodeStatus.READY.value,
        fleet_setting(node.fleet_id) or {},
    )


def heartbeat_validation(rt, node, now):
    """What a heartbeat's answer says of the node's validation: {id, suite} while it validates
    (None otherwise). A validation past its deadline fails here (`node.status` then says so)."""
    if node.status != NodeStatus.VALIDATING.value:
        return None
    row = latest_validation(node.id)
    if row is None or row.state != "running":
        return None
    if row.deadline <= now:
        _finish(
            rt,
            node.id,
            row.id,
            [
                {
                    "name": "deadline",
                    "gpu": None,
                    "status": "failed",
                    "passed": False,
                    "detail": f"no result from the node's agent by {row.deadline.isoformat()}Z",
                }
            ],
            None,
            now,
        )
        node.status = Node.select(Node.status).where(Node.id == node.id).scalar() or node.status
        return None
    return {"id": row.id, "suite": row.suite}


def record_result(rt, node_id, validation_id, checks, system):
    """The node's agent reports the results of a validation (each check, per GPU where it has one).
    A result for a validation already finished is accepted and ignored (a retried report)."""
    now = rt.clock.now()
    _finish(rt, node_id, validation_id, checks, system, now)


def _server_checks(node_id):
    """Checks fleetd adds to the agent's: no GPU of the node is marked for RMA, and its MIG GPUs
    have the fleet's MIG layout where it has one (services.nodes.mig_layout)."""
    return _rma_checks(node_id) + mig_layout_checks(node_id)


def _rma_checks(node_id):
    marked = gpu_history.rma_marked_on(node_id)
    if not marked:
        return [
            {
                "name": "rma",
                "gpu": None,
                "status": "passed",
                "passed": True,
                "detail": "no GPU of the node is marked for RMA",
            }
        ]
    return [
        {
            "name": "rma",
            "gpu": index,
            "uuid": uuid,
            "serial": serial,
            "status": "failed",
            "passed": False,
            "detail": f"GPU serial {serial} is marked for RMA: {reason}",
        }
        for index, uuid, serial, reason in marked
    ]


def _finish(rt, node_id, validation_id, checks, system, now):
    passed = None
    with write_transaction():
        row = Validation.get_or_none(Validation.id == validation_id)
        if row is None or row.node_id != node_id:
            raise NotFound(f"validation {validation_id} of node {node_id} not found")
        if row.state != "running":
            return None
        checks = [_clean(c) for c in checks] + (
            _server_checks(node_id) if system is not None else []
        )
        passed = all(c["passed"] for c in checks)
        gpu_history.record_validation(
            node_id, row.id, checks, passed, now
        )  # also names each GPU's serial
        row.state = "passed" if passed else "failed"
        row.finished_at, row.checks, row.system = now, checks, system
        row.save()
        node = Node.get_or_none(Node.id == node_id)
        latest = latest_validation(node_id)
        if node is None or node.status != NodeStatus.VALIDATING.value or latest.id != row.id:
            return passed
        if passed:
            reason = f"validation {row.id} passed ({len(checks)} checks)"
            node.drain_repair = False
            switch_node_status(rt, node, row.then_status, reason, now, actor=f"node:{node_id}")
        else:
            reason = f"validation {row.id} failed: {failing_summary(checks)}"[:REASON_MAX]
            switch_node_status(
                rt, node, NodeStatus.FAILED_VALIDATION, reason, now, actor=f"node:{node_id}"
            )
        record_event(
            now,
            "node.validation",
            "node",
            node_id,
            reason,
            NodeStatus.VALIDATING.value,
            node.status,
            actor=f"node:{node_id}",
            data={
                "validation_id": row.id,
                "passed": passed,
                "failed": [c for c in checks if not c["passed"]][:50],
                "fleet": node.fleet_id,
                "hostname": node.hostname,
            },
        )
    if passed and rt.scheduler is not None:
        rt.scheduler.kick(what=node_changed(node))  # new capacity (the kick waits for the commit)
    return passed


def _clean(check):
    status = check.get("status") or ("passed" if check.get("passed") else "failed")
    out = {
        "name": str(check["name"])[:64],
        "gpu": check.get("gpu"),
        "status": status,
        "passed": status != "failed",
        "detail": str(check.get("detail") or "")[:DETAIL_MAX],
    }
    for key in ("uuid", "serial"):
        if check.get(key):
            out[key] = str(check[key])[:128]
    if check.get("output"):
        out["output"] = str(check["output"])[-8000:]
    return out


def failing_summary(checks):
    """The failing checks, each with its GPU: "pcie_link GPU 3 (serial S): ...; row_remap GPU 1
    ..."."""
    parts = []
    for c in checks:
        if c["passed"]:
            continue
        where = (
            ""
            if c.get("gpu") is None
            else f" GPU {c['gpu']}" + (f" (serial {c['serial']})" if c.get("serial") else "")
        )
        parts.append(f"{c['name']}{where}: {c['detail']}")
    return "; ".join(parts) or "no check passed"


def get_validation(node_id):
    """The node's latest validation; NotFound when it has none (or no such node)."""
    row = latest_validation(node_id)
    if row is None:
        if Node.get_or_none(Node.id == node_id) is None:
            raise NotFound(f"node {node_id} not found")
        raise NotFound(f"node {node_id} has not been validated")
    return row
