"""Schemas of nodes, GPUs and events."""

from marshmallow import Schema, fields, validate

from fleetd.models import NodeStatus
from fleetd.schemas.common import (
    Bool,
    FullRegexp,
    Int,
    PageQuerySchema,
    Text,
    Time,
    check_labels,
    page_schema,
)
from fleetd.topology_view import network_of


class GpuSchema(Schema):
    uuid = fields.String()
    index = fields.Integer()
    vendor = fields.String()
    model = fields.String()
    memory_total_bytes = fields.Integer()
    numa_node = fields.Integer(allow_none=True)
    max_tflops = fields.Float(allow_none=True)
    healthy = fields.Boolean()
    health_reason = fields.String()
    mig_mode = fields.String(allow_none=True)
    serial = fields.String(
        allow_none=True, metadata={"description": "the board serial number (GET /gpus/{serial})"}
    )
    board_part_number = fields.String(allow_none=True)
    vbios = fields.String(allow_none=True)
    mig_devices = fields.List(
        fields.Dict(),
        allow_none=True,
        metadata={
            "description": "with MIG enabled: [{uuid, memory_total_bytes, profile, start, size}]"
        },
    )
    mig_target = fields.Dict(
        allow_none=True,
        metadata={
            "description": (
                "dynamic MIG: the layout its agent was asked to make and has not answered yet, "
                "{plan, instances: [{profile, start, size}]}; it takes no MIG work meanwhile"
            )
        },
    )
    mig_blocked = fields.String(
        metadata={
            "description": (
                "dynamic MIG: why its last repartition failed ('' when it did not); a blocked GPU "
                "takes no work until DELETE /gpus/{serial}/mig-block"
            )
        }
    )


class DrainSchema(Schema):
    reason = fields.String()
    deadline = Time()
    started_at = Time()
    repair = fields.Boolean(
        metadata={"description": "drained for repair: undrain validates the node first"}
    )


class ResourcesSchema(Schema):
    cpu_count = fields.Integer()
    memory_bytes = fields.Integer()


class NodeSchema(Schema):
    id = fields.String()
    fleet = fields.String(attribute="fleet_id")
    hostname = fields.String()
    address = fields.String()
    status = fields.String()
    status_reason = fields.String()
    labels = fields.Dict(
        metadata={
            "description": "the node's labels, as placement reads them: agent_labels with "
            "label_overrides on top"
        }
    )
    agent_labels = fields.Function(
        lambda node: node.agent_labels or {},
        metadata={"description": "labels of the agent's config file, as it last reported them"},
    )
    label_overrides = fields.Function(
        lambda node: node.label_overrides or {},
        metadata={
            "description": "labels set through the API (PATCH); they win per key over the agent's"
        },
    )
    agent_version = fields.String()
    bundle_sha256 = fields.String(
        metadata={
            "description": "SHA-256 of the offline bundle the agent was installed "
            "from, as its heartbeats report ('' when unknown)"
        }
    )
    registered_at = Time()
    last_heartbeat_at = Time()
    drain = fields.Method("_drain")
    cordon = fields.Method(
        "_cordon",
        metadata={
            "description": (
                "the operator's cordon while it holds, {reason, at, actor} (reason: the "
                "operator's own words, '' when none was given), whatever fleetd says of the node "
                "meanwhile in status_reason (an upgrade, a validation); null once the node is "
                "ready again, or when no operator cordoned it"
            )
        },
    )
    resources = fields.Method("_resources")
    gpus = fields.List(fields.Nested(GpuSchema), attribute="gpu_list")
    gpu_status = fields.String(
        allow_none=True,
        metadata={
            "enum": ["ok", "cpu_only", "driver_error", None],
            "description": (
                "ok: it has GPUs; cpu_only: no NVIDIA driver or no GPU (a CPU-only host); "
                "driver_error: a driver is there and NVML failed (a GPU host that needs "
                "attention); null before it said"
            ),
        },
    )
    gpu_status_reason = fields.String(
        metadata={"description": "why it has no usable GPU, as its agent says"}
    )
    capabilities = fields.Method(
        "_capabilities",
        metadata={
            "description": (
                "isolation: uid (tasks run as their owner's uid) or none (the agent cannot switch "
                "users, or never said); containers: ready or unavailable: <reason>; "
                "container_runtime"
            )
        },
    )
    topology = fields.Raw(
        allow_none=True,
        metadata={
            "description": (
                "its GPUs' topology as its agent reported it at registration: {gpus: [uuid], "
                "links: [[class]] (the best path of each GPU pair, in the order of gpus: nvlink, "
                "nvswitch, pcie_switch, host_bridge, numa, system; self on the diagonal), "
                "nvlink_count: [[int]] (the NVLinks of each pair, 0 without), nics: [{name, kind, "
                "pci_bus_id, links: [class to each GPU]}]}; null when it reported none"
            )
        },
    )
    network = fields.Method(
        "_network",
        metadata={
            "description": (
                "its place in the network, {block?, leaf?, spine?}, from its labels "
                "topology.fleetd/block, topology.fleetd/leaf and topology.fleetd/spine"
            )
        },
    )

    upgrade = fields.Method(
        "_upgrade",
        metadata={
            "description": (
                "while an agent upgrade is under way or has failed: {reason, started_at, failed, "
                "returns_to: {status, reason}}, the state the node goes back to once it succeeds; "
                "null otherwise"
            )
        },
    )

    def _network(self, node):
        return network_of(node.labels)

    def _upgrade(self, node):
        record = node.upgrade
        if record is None:
            return None
        before = record["before"]
        return {
            "reason": record["reason"],
            "started_at": record["started_at"],
            "failed": record.get("failed"),
            "returns_to": {
                "status": before["status"],
                "reason": before.get("drain_reason") or before.get("reason"),
            },
        }

    def _capabilities(self, node):
        out = {
            "isolation": node.isolation,
            "containers": node.containers,
            "container_runtime": node.container_runtime,
        }
        reason = (node.capabilities or {}).get("isolation_reason")
        if reason:
            out["isolation_reason"] = reason
        return out

    def _drain(self, node):
        drain = node.drain
        return None if drain is None else DrainSchema().dump(drain)

    def _cordon(self, node):
        cordon = node.cordon
        if cordon is None:
            return None
        return {"reason": cordon["reason"], "at": cordon["at"], "actor": cordon["actor"]}

    def _resources(self, node):
        return {"cpu_count": node.cpu_count, "memory_bytes": node.memory_bytes}


NodePageSchema = page_schema(NodeSchema, "NodePage")


class NodeQuerySchema(PageQuerySchema):
    fleet = Text(max_length=63, load_default=None)
    status = fields.String(
        validate=validate.OneOf([s.value for s in NodeStatus]), load_default=None
    )
    agent_version = Text(
        min_length=1,
        max_length=64,
        load_default=None,
        metadata={"description": "only nodes whose agent reports this version (track a rollout)"},
    )
    hostname = Text(
        max_length=255,
        load_default=None,
        metadata={"description": "only nodes of exactly this hostname"},
    )


class NodeCordonSchema(Schema):
    reason = Text(
        min_length=1,
        max_length=500,
        metadata={
            "description": 'why (the node\'s status reason and event); default "cordoned by admin"'
        },
    )


class NodeDrainSchema(Schema):
    reason = Text(required=True, min_length=1, max_length=500)
    deadline_seconds = Int(minimum=0, maximum=30 * 86400, load_default=3600)
    repair = Bool(
        load_default=False,
        metadata={
            "description": (
                "a drain for repair: undraining the node validates it before it takes work (on a "
                "node already draining or drained, marks that drain for repair)"
            )
        },
    )


class NodePatchSchema(Schema):
    labels = fields.Dict(
        keys=fields.String(),
        values=Text(max_length=255, allow_none=True),
        required=True,
        validate=check_labels,
        metadata={
            "description": "{key: value} sets a label through the API (it wins over the agent's "
            "file); {key: null} drops the one set through the API"
        },
    )


class NodeUpgradeSchema(Schema):
    reason = Text(
        required=True,
        min_length=1,
        max_length=500,
        metadata={"description": "what is installed, e.g. 'fleet-agent 0.1.0 -> 0.1.1'"},
    )
    deadline_seconds = Int(
        minimum=0,
        maximum=30 * 86400,
        load_default=3600,
        metadata={"description": "drain deadline of a ready or cordoned node"},
    )


class NodeUpgradeEndSchema(Schema):
    outcome = fields.String(required=True, validate=validate.OneOf(["succeeded", "failed"]))
    detail = Text(
        max_length=1000,
        load_default="",
        metadata={"description": "what was installed, or why it failed"},
    )


class EventSchema(Schema):
    id = fields.Function(lambda e: str(e.id))
    at = Time()
    kind = fields.String()
    subject = fields.Function(lambda e: f"{e.subject_type}/{e.subject_id}")
    from_status = fields.String(allow_none=True)
    to_status = fields.String(allow_none=True)
    reason = fields.String()
    actor = fields.String()  # who caused it: token:<name>, node:<id> or fleetd
    actor_token_id = fields.String(
        allow_none=True,
        metadata={
            "description": (
                "the id of the API token that caused it (names of tokens are reused over time); "
                "null when a node or fleetd did"
            )
        },
    )
    actor_via = fields.String(
        allow_none=True,
        metadata={
            "description": (
                "how the actor authenticated: token:<name> (an API token; a user's own token too, "
                "whose actor is user:<login>), session (a user's signed-in session) or jwt; null "
                "when a node, a join token or fleetd did, and for events older than migration 0042"
            )
        },
    )


EventPageSchema = page_schema(EventSchema, "EventPage")


class BootstrapRunSchema(Schema):
    """A provisioning run on a node, recorded as its event (`fleetd bootstrap` sends one per
    host)."""

    kind = fields.String(
        required=True,
        validate=validate.OneOf(["node.bootstrap"]),
        metadata={"description": "what is recorded; node.bootstrap is the one kind"},
    )
    host = Text(
        required=True,
        min_length=1,
        max_length=255,
        metadata={
            "description": (
                "the host as the run reached it (user@address:port); the event names the node's "
                "hostname, or this host's address when the node has none"
            )
        },
    )
    outcome = fields.String(
        required=True,
        validate=validate.OneOf(
            ["enrolled", "upgraded", "downgraded", "updated", "unchanged", "failed"]
        ),
    )
    bundle_version = Text(max_length=64, load_default="")
    bundle_sha256 = fields.String(
        validate=FullRegexp(r"^([0-9a-f]{64})?$", error="must be 64 hex digits"), load_default=""
    )
    detail = Text(
        max_length=1000,
        load_default="",
        metadata={"description": "what the run did, or why it failed"},
    )


class EventQuerySchema(PageQuerySchema):
    after = Int(maximum=2**62, load_default=None, strict=False)
