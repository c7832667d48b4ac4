"""Why a job waits: which filter leaves it no node (fleet, labels, container runtime, allowed
images, GPU types, GPUs per node, ranks), for the pending reasons the scheduling passes record."""

from fleetd import scheduler


def capacity_reason(rt, request):
    """Why a new job could never run on the nodes enrolled now (None: it waits for capacity);
    what a submit answers with before the first pass has looked at the job."""
    return never_fits(rt.inventory.get(), request)


def never_fits(inventory, request):
    """Why no enrolled node could ever hold the request, whatever ran or left service (None when
    some could: it waits for capacity). Counts GPUs, CPUs and memory of the nodes its selector
    and GPU types accept: only its fleet's (or its one node) are looked at."""
    selector = request.node_selector
    key = (
        selector.fleet,
        tuple(sorted(selector.labels.items())),
        selector.node_id,
        selector.container,
        selector.image,
        0 if request.mig else request.gpu_count,
        frozenset(request.gpu_types),
        request.cpu_milli,
        request.memory_bytes,
        request.num_nodes,
    )
    answers = inventory.answers
    if answers is None:
        return _never_fits(inventory, request)
    try:
        return answers[key]
    except KeyError:  # a lost race between threads computes an answer twice
        pass
    found = _never_fits(inventory, request)
    if len(answers) >= 4096:  # shapes are few; bound them all the same
        answers.clear()
    answers[key] = found  # another thread may clear them before this returns: `found` is kept
    return found


def _never_fits(inventory, request):
    # MIG devices come and go with a GPU's layout: a MIG request is never ruled out here; the
    # engine's "mig" stage says why it waits.
    selector, need = request.node_selector, 0 if request.mig else request.gpu_count
    types = set(request.gpu_types)
    # Nodes its fleet (or its one node) holds; of those, with its labels; of those, able to run it
    # (a container runtime and an allowed image); of those, of its GPU types: which filter left
    # none is what the reason says.
    enrolled = labelled = with_runtime = runnable = matching = able = most = 0
    models_seen: set[str] = set()
    runtimes_seen: set[str] = set()
    fleets_seen: set[str] = set()
    if selector.node_id is not None:
        node = inventory.by_id.get(selector.node_id)
        nodes = [node] if node is not None else []
    elif selector.fleet is not None:
        nodes = inventory.by_fleet.get(selector.fleet, [])
    else:
        nodes = inventory.nodes
    for node in nodes:
        if selector.fleet is not None and node.fleet_id != selector.fleet:
            continue
        if selector.node_id is not None and node.id != selector.node_id:
            continue
        enrolled += 1
        if any((node.labels or {}).get(k) != v for k, v in selector.labels.items()):
            continue
        labelled += 1
        if selector.container and node.containers != scheduler.READY:
            if len(runtimes_seen) < 3:
                runtimes_seen.add(node.containers)
            continue
        with_runtime += 1
        fleet = inventory.fleets.get(node.fleet_id)
        if (
            selector.image is not None
            and fleet is not None
            and not scheduler.image_allowed(selector.image, tuple(fleet.allowed_images))
        ):
            if len(fleets_seen) < 3:
                fleets_seen.add(node.fleet_id)
            continue
        runnable += 1
        models = inventory.models.get(node.id, frozenset())
        if need and types and not (models and models <= types):
            models_seen |= models
            continue
        matching += 1
        gpus = len(inventory.gpus.get(node.id, ()))
        most = max(most, gpus)
        if (
            gpus >= need
            and node.cpu_count * scheduler.MILLI >= request.cpu_milli
            and node.memory_bytes >= request.memory_bytes
        ):
            able += 1
    if able >= request.num_nodes:
        return None
    if not matching:
        return _none_matches(
            selector,
            types,
            (enrolled, labelled, with_runtime, runnable),
            (models_seen, runtimes_seen, fleets_seen),
        )
    if need > most:
        return (
            f"no enrolled node could ever hold it: it needs {need} GPUs on one node, the most any "
            f"matching node has is {most}"
        )
    if not able:
        return (
            "no enrolled node could ever hold it: no matching node has the CPUs and memory it asks "
            "for"
        )
    return (
        f"no enrolled nodes could ever hold it: {able} node(s) could take a rank, it needs "
        f"{request.num_nodes}"
    )


def _none_matches(selector, types, counts, seen):
    """Why no enrolled node matches, by the first of its filters that left none: `counts` of the
    nodes left after each filter, `seen` what the last ones left had instead (a few of each)."""
    enrolled, labelled, with_runtime, runnable = counts
    models_seen, runtimes_seen, fleets_seen = seen
    if selector.node_id is not None:
        return (
            f"node {selector.node_id}, which holds its volume, is no longer enrolled (or not of "
            f"its GPU types)"
        )
    where = f" of fleet {selector.fleet}" if selector.fleet is not None else ""
    if not enrolled:
        return (
            f"no node is enrolled in fleet {selector.fleet}"
            if selector.fleet is not None
            else "no node is enrolled"
        )
    if not labelled:
        wanted = ", ".join(f"{k}={v}" for k, v in sorted(selector.labels.items()))
        return f"no enrolled node{where} has the labels it selects ({wanted})"
    where += " with the labels it selects" if selector.labels else ""
    if not with_runtime:
        return (
            f"no enrolled node{where} can run its image: none has a ready container runtime "
            f"(containers {'; '.join(sorted(runtimes_seen))})"
        )
    if not runnable:
        return (
            f"no enrolled node{where} can run its image: their fleet's allowed_images do not admit "
            f"{selector.image} ({', '.join(sorted(fleets_seen))})"
        )
    have = sorted(models_seen)
    return (
        f"no enrolled node{where} has GPUs of the types it asks for ({', '.join(sorted(types))}); "
        f"their GPUs: "
        f"{', '.join(have[:5]) or 'none'}{f' and {len(have) - 5} more' if len(have) > 5 else ''}"
    )


def pinned_reason(node_id, details):
    """Why a run held to the node with its volume waits: that node's own verdict."""
    for detail in details:
        if detail.node_id == node_id:
            return f"waiting for node {node_id}, which holds its volume: {detail.reason}"
    return None


def nowhere(request):
    """Why no node was even looked at: none of its fleet has the GPU types it accepts."""
    types = ", ".join(request.gpu_types) or "any"
    return (
        f" (no node of fleet {request.node_selector.fleet} has GPUs of the accepted type(s): "
        f"{types})"
    )
