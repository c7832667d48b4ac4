"""Resolvers: GraphQL inputs mapped onto the REST schemas and the services, and the services'
answers mapped onto GraphQL's field names. Nothing here decides: a create is the REST body
InstanceSpecSchema validates, a stop, resume or terminate is the REST route's service call."""

import math
import re
import shlex
import time

from ariadne import MutationType, ObjectType, QueryType, ScalarType
from marshmallow import ValidationError

from fleetd.api.parser import forbidden_text
from fleetd.errors import InvalidRequest
from fleetd.schemas.instances import InstanceSpecSchema
from fleetd.services.placement import capacity, cluster
from fleetd.services.workloads import connections, instance_views, instances

GIB = 1 << 30
PODS_PAGE = (
    1000  # myself { pods } reads the REST list page by page (its largest page), oldest first ...
)
MAX_POD_PAGES = 100  # ... to at most 100,000 instances; past that, the REST list and its cursor
# The imageName that asks for a host process (docs/api.md, GraphQL): the SDKs' create_pod always
# sends an image. An image of that name is still reached by its full reference
# (docker.io/library/host).
HOST_PROCESS_IMAGE = "host"
CPU_INSTANCE = re.compile(
    r"^cpu\d*[a-z]*-(\d{1,4})-(\d{1,5})$"
)  # deployCpuPod's instanceId: cpu3c-2-4 (vCPUs, GB)

query = QueryType()
mutation = MutationType()
gpu_type = ObjectType("GpuType")
user = ObjectType("User")
void = ScalarType("Void", serializer=lambda value: None)


def _ctx(info):
    return info.context["rt"], info.context["principal"]


# ---------------------------------------------------------------- instances as pods


def _gib(value):
    return round((value or 0) / GIB, 3)


def _desired_status(view):
    if view["state"] in ("deleting", "deleted"):
        return "TERMINATED"
    return "RUNNING" if view["desired_state"] == "running" else "EXITED"


def pod(view):
    """An Instance of docs/api.md as a Pod of the GraphQL schema."""
    spec = view["spec"]
    resources = spec.get("resources") or {}
    ports = spec.get("ports") or []
    runtime = view["runtime"]
    gpu_types = resources.get("gpu_types") or []
    return {
        "id": view["id"],
        "name": view["name"],
        "state": view["state"],
        "desiredStatus": _desired_status(view),
        "lastStatusChange": view["status_reason"],
        "imageName": spec.get("image"),
        "dockerArgs": shlex.join(spec.get("command") or []),
        "dockerId": None,
        "env": [f"{k}={v}" for k, v in (spec.get("env") or {}).items()],
        "gpuCount": resources.get("gpus") or 0,
        "vcpuCount": resources.get("cpus") or 0,
        "memoryInGb": _gib(resources.get("memory_bytes")),
        "volumeInGb": _gib(spec.get("volume_bytes")),
        "volumeMountPath": spec.get("volume_mount_path"),
        "containerDiskInGb": _gib(spec.get("scratch_bytes")) if spec.get("scratch_bytes") else None,
        "runtimeArgs": spec.get("runtime_args") or [],
        "podType": "INTERRUPTABLE" if spec.get("priority_class") == "spot" else "RESERVED",
        "costPerHr": view["price_per_hour"],
        "bidPerGpu": spec.get("bid"),
        "costSoFar": view["cost_so_far"],
        "storageCostSoFar": view.get("storage_cost_so_far"),
        "port": ports[0]["port"] if ports else None,
        "ports": ",".join(f"{p['port']}/{p['protocol']}" for p in ports),
        "uptimeSeconds": runtime["uptime_seconds"] if runtime else 0,
        "machineId": view["node_id"],
        "machine": {
            "podHostId": view["node_hostname"],
            "clusterHostId": view["node_hostname"],
            "hostname": view["node_hostname"],
            "gpuDisplayName": gpu_types[0] if gpu_types else None,
        },
        "runtime": _runtime(runtime) if runtime else None,
    }


def _runtime(runtime):
    container = runtime.get("container")
    return {
        "uptimeInSeconds": runtime["uptime_seconds"],
        "ports": [
            {
                "ip": p["ip"],
                "isIpPublic": p["is_ip_public"],
                "privatePort": p["private_port"],
                "publicPort": p["public_port"],
                "type": p["type"],
            }
            for p in runtime["ports"]
        ],
        "gpus": [
            {
                "id": g.get("uuid"),
                "gpuUtilPercent": g.get("gpu_util_percent"),
                "memoryUtilPercent": g.get("memory_util_percent"),
            }
            for g in runtime["gpus"]
        ],
        "container": (
            {
                "cpuPercent": container.get("cpu_percent"),
                "memoryPercent": container.get("memory_percent"),
            }
            if container
            else None
        ),
    }


def _pod_of(rt, inst):
    return pod(instance_views.instance_view(rt, inst))


def _instance_id(data):
    """The podId or clusterId of an input; a NUL or an unpaired surrogate (which no database takes)
    is refused as the REST routes refuse it in a path."""
    instance_id = next(
        (data[key] for key in ("podId", "clusterId") if data.get(key) is not None), ""
    )
    if forbidden_text(instance_id):
        raise InvalidRequest("the id holds a NUL character or an unpaired surrogate")
    return instance_id


def _ports(text):
    """ "8888/http,22/tcp" as the REST body's ports (a port without a protocol is http)."""
    ports = []
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        number, _, protocol = item.partition("/")
        if not number.isdigit():
            raise InvalidRequest(
                f"ports: {item!r} is not PORT/PROTOCOL (8888/http,22/tcp)",
                {"fields": {"ports": ["PORT/PROTOCOL, comma-separated"]}},
            )
        ports.append({"port": int(number), "protocol": protocol or "http"})
    return ports


def _command(text):
    try:
        return shlex.split(text or "")
    except ValueError as exc:
        raise InvalidRequest(f"dockerArgs: {exc}", {"fields": {"dockerArgs": [str(exc)]}}) from None


def _bytes_of_gb(data, key):
    """A size in GB of an input as bytes; one no byte count can hold (1e308 GB) is refused naming
    it."""
    size = (data.get(key) or 0) * GIB
    if not math.isfinite(size) or abs(size) >= 2**63:
        raise InvalidRequest(
            f"{key}: {data[key]} GB is not a size", {"fields": {key: ["not a size"]}}
        )
    return int(size)


def instance_body(data, spot, cloud_labels=None):
    """The REST InstanceSpec body a create input stands for (docs/api.md, GraphQL: field mapping).
    `cloud_labels`: the node labels the input's cloudType selects (settings.cloud_type_labels).
    Input fields fleetd has no notion of (startSsh, supportPublicIp, countryCode,
    allowedCudaVersions, minDownload, minUpload, deployCost) are ignored."""
    for unsupported in ("templateId", "networkVolumeId"):
        if data.get(unsupported):
            raise InvalidRequest(
                f"{unsupported}: fleetd has no templates or network volumes; send the image, "
                "command and volume size instead",
                {"fields": {unsupported: ["not supported"]}},
            )
    resources = {"gpus": data["gpuCount"] if data.get("gpuCount") is not None else 1}
    if data.get("gpuTypeId"):
        resources["gpu_types"] = [data["gpuTypeId"]]
    if data.get("minVcpuCount"):
        resources["cpus"] = data["minVcpuCount"]
    if data.get("minMemoryInGb"):
        resources["memory_bytes"] = _bytes_of_gb(data, "minMemoryInGb")
    image = data.get("imageName") or None
    body = {
        "name": data["name"],
        "command": _command(data.get("dockerArgs")),
        "image": None if image == HOST_PROCESS_IMAGE else image,
        "env": {e["key"]: e["value"] for e in data.get("env") or ()},
        "resources": resources,
        "volume_bytes": _bytes_of_gb(data, "volumeInGb"),
        "ports": _ports(data.get("ports")),
    }
    if data.get("volumeMountPath"):
        body["volume_mount_path"] = data["volumeMountPath"]
    if data.get("containerDiskInGb"):
        body["scratch_bytes"] = _bytes_of_gb(data, "containerDiskInGb")
    if data.get("runtimeArgs"):
        body["runtime_args"] = list(data["runtimeArgs"])
    selector = {}
    if data.get("dataCenterId"):
        selector["fleet"] = data["dataCenterId"]
    labels = (cloud_labels or {}).get(data.get("cloudType") or "ALL")
    if labels:
        selector["labels"] = dict(labels)
    if selector:
        body["node_selector"] = selector
    if spot:
        body["priority_class"] = "spot"
        body["bid"] = data["bidPerGpu"]
    return body


def _spec(body):
    try:
        return InstanceSpecSchema().load(body)
    except ValidationError as exc:
        raise InvalidRequest(
            "the input did not validate (fields named as in the REST InstanceSpec)",
            {"fields": exc.messages},
        ) from None


def _create(info, data, spot):
    rt, principal = _ctx(info)
    body = instance_body(data, spot, rt.settings.cloud_type_labels)
    return _pod_of(rt, instances.create_instance(rt, principal, _spec(body)))


def cpu_pod_input(data):
    """deployCpuPod's input as an on-demand create of no GPUs: instanceId (cpu3c-2-4: 2 vCPUs, 4 GB)
    gives the CPUs and memory; the SDK's default template stands for its image, which the input
    names."""
    out = {k: v for k, v in data.items() if k not in ("instanceId", "templateId")}
    if data.get("templateId") and not data.get("imageName"):
        raise InvalidRequest(
            "templateId: fleetd has no templates; send imageName (and dockerArgs) instead",
            {"fields": {"templateId": ["not supported"]}},
        )
    out["gpuCount"] = 0
    if data.get("instanceId"):
        match = CPU_INSTANCE.match(data["instanceId"])
        if match is None:
            raise InvalidRequest(
                "instanceId: cpu<generation>-<vCPUs>-<GB of memory> (e.g. cpu3c-2-4)",
                {"fields": {"instanceId": ["cpu<generation>-<vCPUs>-<GB>"]}},
            )
        out["minVcpuCount"], out["minMemoryInGb"] = int(match.group(1)), int(match.group(2))
    return out


@mutation.field("deployCpuPod")
def resolve_deploy_cpu_pod(_, info, input):  # noqa: A002
    return _create(info, cpu_pod_input(input), spot=False)


@mutation.field("podFindAndDeployOnDemand")
@mutation.field("clusterFindAndDeployOnDemand")
def resolve_deploy_on_demand(_, info, input):  # noqa: A002 - the schema's argument name
    return _create(info, input, spot=False)


@mutation.field("podRentInterruptable")
@mutation.field("clusterRentInterruptable")
def resolve_rent_interruptable(_, info, input):  # noqa: A002
    return _create(info, input, spot=True)


@mutation.field("podResume")
@mutation.field("clusterResume")
def resolve_resume(_, info, input):  # noqa: A002
    rt, principal = _ctx(info)
    return _pod_of(
        rt, instances.resume_instance(rt, principal, _instance_id(input), input.get("gpuCount"))
    )


@mutation.field("podBidResume")
@mutation.field("clusterBidResume")
def resolve_bid_resume(_, info, input):  # noqa: A002
    rt, principal = _ctx(info)
    return _pod_of(
        rt,
        instances.resume_instance(
            rt, principal, _instance_id(input), input.get("gpuCount"), input["bidPerGpu"]
        ),
    )


@mutation.field("podStop")
@mutation.field("clusterStop")
def resolve_stop(_, info, input):  # noqa: A002
    rt, principal = _ctx(info)
    return _pod_of(rt, instances.stop_instance(rt, principal, _instance_id(input)))


@mutation.field("podTerminate")
@mutation.field("clusterTerminate")
def resolve_terminate(_, info, input):  # noqa: A002
    rt, principal = _ctx(info)
    instances.delete_instance(rt, principal, _instance_id(input))


@query.field("myself")
def resolve_myself(_, info):
    return {"id": info.context["principal"].name, "pubKey": None, "networkVolumes": []}


@user.field("pods")
@user.field("clusters")
def resolve_pods(_, info):
    rt, principal = _ctx(info)
    out, cursor = [], None
    for _page in range(MAX_POD_PAGES):
        items, cursor = instances.list_instances(principal, PODS_PAGE, cursor)
        out += [pod(view) for view in instance_views.instance_views(rt, items)]
        if cursor is None:
            return out
    raise InvalidRequest(
        f"more than {PODS_PAGE * MAX_POD_PAGES} instances: read them page by page with "
        "GET /api/v1/instances?cursor="
    )


@query.field("pod")
@query.field("cluster")
def resolve_pod(_, info, input):  # noqa: A002
    rt, principal = _ctx(info)
    return _pod_of(rt, instances.get_instance(principal, _instance_id(input)))


@query.field("podConnection")
@query.field("clusterConnection")
def resolve_connection(_, info, input):  # noqa: A002
    """REST's connection of a declared port, waiting up to waitSeconds (0 to 300) in long-poll
    slices."""
    rt, principal = _ctx(info)
    most = instances.CONNECTION_WAIT_MAX_SECONDS
    wait, port = input.get("waitSeconds") or 0, input.get("port")
    if not 0 <= wait <= most:
        raise InvalidRequest(
            f"waitSeconds: 0 to {most}", {"fields": {"waitSeconds": [f"0 to {most}"]}}
        )
    if port is not None and not 1 <= port <= 65535:
        raise InvalidRequest("port: 1 to 65535", {"fields": {"port": ["1 to 65535"]}})
    # The waits of one document share one budget: aliases of this field do not wait 300 s each.
    deadline = info.context.setdefault("connection_wait_deadline", time.monotonic() + most)
    wait = min(wait, max(0.0, deadline - time.monotonic()))
    return connections.connection_within(rt, principal, _instance_id(input), port, wait)


# ---------------------------------------------------------------- GPU types


def _gpu_type(entry, clouds):
    memory = entry.get("memory_bytes")
    return {
        "id": entry["model"],
        "displayName": entry["display_name"],
        "manufacturer": entry["manufacturer"],
        "memoryInGb": _gib(memory) if memory is not None else None,
        "maxGpuCount": entry["max_per_node"],
        "totalCount": entry["total"],
        "availableCount": entry["available"],
        "cudaCores": None,
        "secureCloud": entry["model"] in clouds["SECURE"],
        "communityCloud": entry["model"] in clouds["COMMUNITY"],
        "securePrice": entry.get("price_per_hour"),
        "communityPrice": None,
        "secureSpotPrice": entry.get("spot_min_bid"),
        "communitySpotPrice": None,
        "oneWeekPrice": None,
        "oneMonthPrice": None,
        "threeMonthPrice": None,
        "entry": entry,
    }


@query.field("gpuTypes")
def resolve_gpu_types(_, info, input=None):  # noqa: A002
    rt, _principal = _ctx(info)
    wanted = (input or {}).get("id")
    state = cluster.current_state(rt)
    clouds = {
        kind: capacity.models_on_nodes_with(state, labels)
        for kind, labels in rt.settings.cloud_type_labels.items()
    }
    return [
        _gpu_type(e, clouds)
        for e in capacity.gpu_types(state)
        if wanted is None or e["model"] == wanted
    ]


@gpu_type.field("lowestPrice")
def resolve_lowest_price(gpu, _info, input=None):  # noqa: A002
    price = capacity.lowest_price(gpu["entry"], (input or {}).get("gpuCount") or 1)
    return {
        "gpuCount": price["gpu_count"],
        "available": price["available"],
        "minimumBidPrice": price["minimum_bid_price"],
        "uninterruptablePrice": price["uninterruptable_price"],
    }


BINDABLES = [query, mutation, gpu_type, user, void]
