"""Each node's place in the network, as the scheduler's snapshot carries it: its
`topology.fleetd/block|leaf|spine` labels, else its fleet's topology file by its hostname.

A fleet's file is parsed once per change of its text and a node's place made once per change of the
node (or of its fleet's file), both kept with the inventory as its links are, so a pass at 10,000
nodes reads each from a dictionary.
"""

from fleetd.scheduler import NetworkPlace
from fleetd.scheduler.network_file import TopologyFileError, parse_topology, place_of


def fleet_places(inventory, fleet_name):
    """{hostname: NetworkPlace} of the fleet's topology file, or None without one."""
    fleet = inventory.fleets.get(fleet_name)
    text = fleet.network_topology if fleet is not None else None
    if not text:
        return None
    cache = inventory.network_files
    hit = cache.get(fleet_name) if cache is not None else None
    if hit is not None and hit[0] == text:
        return hit[1]
    try:
        places = parse_topology(text)
    except TopologyFileError:  # the API refuses such a file; one stored otherwise places nobody
        places = {}
    if cache is not None:
        cache[fleet_name] = (text, places)
    return places


def node_place(inventory, node) -> NetworkPlace | None:
    """The node's place (labels win over its fleet's file, whole), or None when neither says."""
    cache = inventory.places
    if cache is not None and node.id in cache:
        return cache[node.id]
    place = place_of(node.hostname or "", node.labels or {}, fleet_places(inventory, node.fleet_id))
    if cache is not None:
        cache[node.id] = place
    return place


def carried_places(previous, fleets, by_id, changed):
    """(parsed files, node places) of the inventory `previous` that still hold in one patched from
    it: those of fleets whose file is as it was, and of their nodes that did not change.

    Another thread may be filling `previous`'s caches meanwhile (a pass's engine build makes every
    node's place): each is copied in one step (dict(), which runs no Python code, so no other
    thread runs in between) before it is iterated. Iterated as it was, a place added meanwhile
    failed the reload ("dictionary changed size during iteration"), and with it the submit that
    asked for the inventory.
    """
    previous_files = dict(previous.network_files or {})
    previous_places = dict(previous.places or {})
    same = {
        name
        for name, fleet in fleets.items()
        if name in previous.fleets
        and previous.fleets[name].network_topology == fleet.network_topology
    }
    files = {name: hit for name, hit in previous_files.items() if name in same}
    places = {
        node_id: place
        for node_id, place in previous_places.items()
        if node_id in by_id and node_id not in changed and by_id[node_id].fleet_id in same
    }
    return files, places
