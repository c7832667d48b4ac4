"""The capacity views operators read: the GPU summary of cluster status (placement.status lists
what runs), the allocation view, GPU types and their prices, display names of GPU models. They
read a ClusterState (placement.cluster)."""

import copy

from fleetd import scheduler
from fleetd.clock import isoformat
from fleetd.errors import NotFound
from fleetd.models import (
    GpuType,
    Task,
)
from fleetd.services.placement.inventory import BLOCK_TEXT, GpuRow, series_id


def gpu_summary(state, demand):
    """The `gpu` part of cluster status: counts overall and per series, and why GPUs are blocked.
    Pure (no database, no locks): it may run in a worker thread.

    Each GPU is classified as `scheduler.gpu_state` would classify it in `state.gpu_rows()`, but
    counted straight from the inventory and the holds: no row or snapshot is built per GPU (at
    80,000 GPUs that took about a second of CPU for every scrape of /metrics)."""
    held, holding = state.held, state.node_use  # node_use: every node some task holds
    series_of: dict[str, str] = {}  # model -> its series
    overall = {"total": 0, "used": 0, "free": 0, "blocked": 0}
    series: dict[str, dict[str, int]] = {}
    labels: dict[str, str] = {}
    notes: dict[tuple[str, str], dict] = {}
    by_series = _of_inventory(state, "gpus_by_series", _gpus_by_series, copied=False)

    def note_of(code, sid):
        note = notes.get((code, sid))
        if note is None:
            note = notes[(code, sid)] = {
                "code": code,
                "series": sid,
                "count": 0,
                "reason": BLOCK_TEXT.get(code, code),
            }
        return note

    for node in state.nodes:
        gpus = state.gpus.get(node.id, ())
        if not gpus:
            continue
        block = state.block(node)
        shapes = by_series[node.id]
        # Nothing held here, one series (so notes come in the order GPU by GPU gives): its GPUs
        # are counted at once. At 100,000 nodes that is most of them, and 800,000 GPUs fewer to
        # look at one by one for each /metrics scrape.
        if node.id not in holding and len(shapes) == 1:
            for sid, model, healthy, sick in shapes:
                counts = series.get(sid)
                if counts is None:
                    counts = series[sid] = {"total": 0, "used": 0, "free": 0, "blocked": 0}
                    labels[sid] = model
                free, blocked = (0, healthy + sick) if block is not None else (healthy, sick)
                counts["total"] += healthy + sick
                counts["free"] += free
                counts["blocked"] += blocked
                overall["total"] += healthy + sick
                overall["free"] += free
                overall["blocked"] += blocked
                if blocked:
                    note = note_of(block.code if block is not None else "unhealthy", sid)
                    note["count"] += blocked
                    if block is not None and block.next_open_at:
                        note["next_open_at"] = isoformat(block.next_open_at)
            continue
        for gpu in gpus:
            sid = series_of.get(gpu.model)
            if sid is None:
                sid = series_of[gpu.model] = series_id(gpu.model)
            counts = series.get(sid)
            if counts is None:
                counts = series[sid] = {"total": 0, "used": 0, "free": 0, "blocked": 0}
                labels[sid] = gpu.model
            h = held.get((node.id, gpu.uuid))
            if h is not None and (h[2] or h[0] > 0 or (h[1] > 0 and gpu.memory_total_bytes > 0)):
                kind = "used"
            elif block is not None or not gpu.healthy:
                kind = "blocked"
                note = note_of(block.code if block is not None else "unhealthy", sid)
                note["count"] += 1
                if block is not None and block.next_open_at:
                    note["next_open_at"] = isoformat(block.next_open_at)
            else:
                kind = "free"
            counts["total"] += 1
            counts[kind] += 1
            overall["total"] += 1
            overall[kind] += 1
    rows = [
        dict(
            id=sid,
            label=labels[sid],
            **counts,
            queued=round(demand.get(sid, 0), 3),
            note=_series_note(notes, sid),
        )
        for sid, counts in sorted(series.items())
    ]
    # Demand no series row holds (a job that takes any model or one of several, or a model no node
    # has) is a row of its own, so that the rows' queued add up to the card's.
    elsewhere = round(sum(gpus for sid, gpus in demand.items() if sid not in series), 3)
    if elsewhere:
        rows.append(
            dict(
                id=ANY_SERIES,
                label=ANY_SERIES_LABEL,
                total=0,
                used=0,
                free=0,
                blocked=0,
                queued=elsewhere,
                note=None,
            )
        )
    return dict(
        overall,
        queued=round(sum(demand.values()), 3),
        blocked_reason=blocked_sentence(notes.values(), labels),
        blocked_notes=list(notes.values()),
        series=rows,
    )


ANY_SERIES = "any"
ANY_SERIES_LABEL = (
    "any GPU model"  # work that takes any model, one of several, or one that no node has
)


def _series_note(notes, sid):
    """The note that blocks most of a series' GPUs ({code, series, next_open_at?}), or None."""
    mine = [note for (code, series), note in notes.items() if series == sid]
    if not mine:
        return None
    top = max(mine, key=lambda note: note["count"])
    return {k: top[k] for k in ("code", "series", "next_open_at") if k in top}


def blocked_sentence(notes, labels):
    """Why GPUs are blocked, in one sentence ('' when none is): the most blocked first."""
    parts = []
    for note in sorted(notes, key=lambda n: (-n["count"], n["series"], n["code"])):
        until = f" until {note['next_open_at']}" if note.get("next_open_at") else ""
        gpus = "GPU" if note["count"] == 1 else "GPUs"
        parts.append(
            f"{note['count']} {labels.get(note['series'], note['series'])} {gpus}: "
            f"{note['reason']}{until}"
        )
    return "; ".join(parts) + ("." if parts else "")


def _of_inventory(state, name, make, copied=True):
    """make(state), made once per inventory (kept with its answers): what depends on the nodes'
    rows and GPUs alone. A copy is returned (unless not `copied`: a caller that only reads it), so
    a caller may change it."""
    answers = state.inventory.answers
    if answers is None:
        return make(state)
    key = ("capacity", name)
    try:
        found = answers[key]
    except KeyError:  # another thread may have cleared them: made again
        found = answers[key] = make(state)
    return copy.deepcopy(found) if copied else found


def _gpus_by_series(state):
    """{node id: ((series, a model of it, healthy GPUs, unhealthy GPUs), ...)} of every node."""
    out = {}
    for node in state.nodes:
        counts: dict[str, list] = {}
        for gpu in state.gpus.get(node.id, ()):
            entry = counts.setdefault(series_id(gpu.model), [gpu.model, 0, 0])
            entry[1 if gpu.healthy else 2] += 1
        out[node.id] = tuple((sid, *entry) for sid, entry in counts.items())
    return out


def node_counts(state):
    """{node status: how many nodes}."""
    return _of_inventory(state, "node_counts", _node_counts)


def _node_counts(state):
    counts: dict[str, int] = {}
    for node in state.nodes:
        counts[node.status] = counts.get(node.status, 0) + 1
    return counts


def profiles(state):
    """Shapes that exist: for each series and GPUs-per-node, how many nodes have it, with a `label`
    to show (seed 003's profile summary)."""
    return _of_inventory(state, "profiles", _profiles)


def _profiles(state):
    shapes: dict[tuple[str, int], int] = {}  # (series, GPUs per node) -> nodes
    models: dict[str, str] = {}  # series -> a model of it
    for node in state.nodes:
        by_series: dict[str, list[GpuRow]] = {}
        for gpu in state.gpus.get(node.id, ()):
            by_series.setdefault(series_id(gpu.model), []).append(gpu)
            models.setdefault(series_id(gpu.model), gpu.model)
        for sid, gpus in by_series.items():
            shapes[(sid, len(gpus))] = shapes.get((sid, len(gpus)), 0) + 1
    return [
        {
            "name": f"{count}x{per}x{sid}",
            "label": profile_label(models[sid], per, count),
            "series": sid,
            "num_nodes": count,
            "gpus_per_node": per,
        }
        for (sid, per), count in sorted(shapes.items())
    ]


def profile_label(model, per_node, nodes):
    """A profile as people read it: "8 x NVIDIA H100 80GB HBM3 per node, 2 nodes"."""
    return f"{per_node} x {model} per node, {nodes} node{'' if nodes == 1 else 's'}"


def cluster_allocation(state, node_id=None):
    """GET /api/v1/cluster/allocation: every GPU, node and task allocation (of one node, with
    `node_id`). Pure: it may run off the event loop."""
    chosen = state.nodes if node_id is None else [n for n in state.nodes if n.id == node_id]
    rows = state.gpu_rows(chosen)
    for row in rows:
        row["next_open_at"] = isoformat(row.get("next_open_at"))
    nodes = {}
    for node in chosen:
        cpu, mem, _ = state.node_use.get(node.id, (0, 0, 0))
        block = state.block(node)
        nodes[node.id] = {
            "hostname": node.hostname,
            "fleet": node.fleet_id,
            "status": node.status,
            "schedulable": block is None,
            "blocked_reason": block.text if block else None,
            "cpu_count": node.cpu_count,
            "cpus_reserved": cpu / scheduler.MILLI,
            "memory_bytes": node.memory_bytes,
            "memory_reserved_bytes": mem,
        }
    allocations = [
        {
            "task_id": t.id,
            "job_id": t.job_id,
            "rank": t.rank,
            "node_id": t.node_id,
            "state": t.state,
            "workload": t.job.workload.as_dict(),
            "run_as": Task.run_as.python_value(t.run_as),
            "gpus": [{k: v for k, v in g.items()} for g in t.gpus],
            "mig_devices": [g["mig_device"] for g in t.gpus if g.get("mig_device")],
            "link_class": t.link_class,
        }
        for t in state.tasks
        if node_id is None or t.node_id == node_id
    ]
    gpu_to_tasks = {row["uuid"]: row["tasks"] for row in rows if row["tasks"]}
    return {"gpus": rows, "nodes": nodes, "allocations": allocations, "gpu_to_tasks": gpu_to_tasks}


def _gpu_type_entry(model, memory_bytes=None):
    manufacturer, display = display_name(model)
    return {
        "model": model,
        "display_name": display,
        "manufacturer": manufacturer,
        "memory_bytes": memory_bytes,
        "total": 0,
        "available": 0,
        "max_per_node": 0,
        "price_per_hour": None,
        "spot_min_bid": None,
    }


def gpu_types(state):
    """GET /api/v1/gpu-types: every model in the fleet (or priced by an admin) with capacity and
    prices."""
    prices = {t.model: t for t in GpuType.select()}
    out: dict[str, dict] = {}
    per_node: dict[tuple[str, str], int] = {}
    for row in state.gpu_rows():
        entry = out.get(row["model"])
        if entry is None:
            entry = out[row["model"]] = _gpu_type_entry(row["model"], row["memory_total_bytes"])
        entry["total"] += 1
        entry["available"] += row["state"] == "free"
        per_node[row["model"], row["node_id"]] = count = (
            per_node.get((row["model"], row["node_id"]), 0) + 1
        )
        entry["max_per_node"] = max(entry["max_per_node"], count)
    for model, priced in prices.items():
        entry = out.setdefault(model, _gpu_type_entry(model))
        entry["price_per_hour"] = priced.price_per_hour
        entry["spot_min_bid"] = priced.spot_min_bid
    return sorted(out.values(), key=lambda e: e["model"])


def models_on_nodes_with(state, labels):
    """The GPU models on enrolled nodes that carry all of `labels` (every node's for no labels)."""
    wanted = dict(labels).items()
    return {
        gpu.model
        for node in state.nodes
        if wanted <= (node.labels or {}).items()
        for gpu in state.gpus.get(node.id, ())
    }


def get_gpu_type(state, model, gpu_count=None):
    """GET /api/v1/gpu-types/{model}: one model as the list has it (NotFound when neither a node has
    it nor an admin priced it), with its lowest prices for `gpu_count` GPUs when asked."""
    entry = next((e for e in gpu_types(state) if e["model"] == model), None)
    if entry is None:
        raise NotFound(f"GPU type {model!r} not found: no node has it and no price is set for it")
    if gpu_count is not None:
        entry["lowest_price"] = lowest_price(entry, gpu_count)
    return entry


def lowest_price(entry, gpu_count):
    """The lowest prices per GPU-hour of `gpu_count` GPUs of a model on one node: the on-demand
    price and the spot minimum bid set by an admin (null when none is set, or when no node has that
    many)."""
    available = 0 < gpu_count <= entry["max_per_node"]
    return {
        "gpu_count": gpu_count,
        "available": available,
        "minimum_bid_price": entry["spot_min_bid"] if available else None,
        "uninterruptable_price": entry["price_per_hour"] if available else None,
    }


_VENDORS = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel"}
_BRANDS = ("GeForce ", "Radeon ", "Tesla ", "Quadro ")


def display_name(model):
    """(manufacturer or None, the model's short name): 'NVIDIA GeForce RTX 3090' -> ('NVIDIA', 'RTX
    3090'), 'NVIDIA H100 80GB HBM3' -> ('NVIDIA', 'H100 80GB HBM3'), as GPU clouds show them."""
    first, _, rest = model.partition(" ")
    manufacturer = _VENDORS.get(first.lower())
    if manufacturer is None or not rest:
        return manufacturer, model
    for brand in _BRANDS:
        if rest.startswith(brand) and len(rest) > len(brand):
            rest = rest[len(brand) :]
    return manufacturer, rest
