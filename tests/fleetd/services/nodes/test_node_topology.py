"""A node's GPU topology (issue 50): what its agent reports at registration is kept, shown with the
node's place in the network, and handed to placement in the order of the node's GPUs. Real API, the
agent's side played by hand."""

from fleetd.services.placement.cluster import current_state
from tests.support.gpus import gpus, topology_x3

UUIDS = [gpu["uuid"] for gpu in gpus(3)]
TOPOLOGY = topology_x3()  # GPU 2, GPU 0, GPU 1; GPUs 0 and 1 NVLinked
NETWORK_LABELS = {
    "topology.fleetd/block": "b07",
    "topology.fleetd/leaf": "leaf-3",
    "rack": "r12",
}


def test_a_registered_node_shows_its_topology_and_its_place_in_the_network(api):
    api.create_fleet("gpu-a")
    reg = api.register(
        api.create_join_token(), gpu_count=3, topology=TOPOLOGY, labels=NETWORK_LABELS
    )
    node = api.node(reg["node_id"])
    assert node["topology"] == TOPOLOGY
    assert node["network"] == {"block": "b07", "leaf": "leaf-3"}
    listed = api.get("/api/v1/nodes").get_json()["items"]
    assert [(n["topology"], n["network"]) for n in listed] == [(TOPOLOGY, node["network"])]


def test_a_node_without_topology_or_network_labels_shows_null_and_an_empty_place(api):
    api.create_fleet("gpu-a")
    node = api.node(api.register(api.create_join_token(), gpu_count=2)["node_id"])
    assert node["topology"] is None and node["network"] == {}


def test_a_topology_of_other_gpus_than_reported_is_refused_with_the_reason(api):
    api.create_fleet("gpu-a")
    body = api.register(api.create_join_token(), gpu_count=2, topology=TOPOLOGY, expect=400)
    assert "topology.gpus must be the uuids of the GPUs reported" in str(body)
    asymmetric = dict(TOPOLOGY, links=[row[:] for row in TOPOLOGY["links"]])
    asymmetric["links"][0][1] = "numa"
    body = api.register(api.create_join_token(), gpu_count=3, topology=asymmetric, expect=400)
    assert "topology.links must be symmetric" in str(body)


def test_registering_again_replaces_the_topology(api, clock):
    api.create_fleet("gpu-a")
    node_id = api.register(api.create_join_token(), gpu_count=3, topology=TOPOLOGY)["node_id"]
    clock.advance(60)  # its agent silent past the TTL: the same machine may register again
    api.register(api.create_join_token(), gpu_count=3)
    assert api.node(node_id)["topology"] is None


def test_placement_sees_each_nodes_links_in_the_order_of_its_gpus(api, app):
    api.create_fleet("gpu-a")
    join = api.create_join_token(max_uses=3)
    linked = api.register(join, machine_id="a", hostname="a", gpu_count=3, topology=TOPOLOGY)
    bare = api.register(join, machine_id="b", hostname="b", gpu_count=3)
    for reg in (linked, bare):
        api.heartbeat(reg["session_token"])
    rt = app.extensions["fleetd"]
    with app.app_context():
        state = current_state(rt)
        nodes = {node.id: node for node in state.snapshot().nodes}
    ours = nodes[linked["node_id"]]
    assert [gpu.uuid for gpu in ours.gpus] == UUIDS
    assert ours.links == (
        ("self", "nvlink", "system"),
        ("nvlink", "self", "system"),
        ("system", "system", "self"),
    )
    assert nodes[bare["node_id"]].links is None
    # Read once per change of the node, then kept with the inventory.
    assert state.inventory.links[linked["node_id"]] is ours.links


def test_a_node_whose_gpus_changed_since_its_registration_has_no_links(api, app):
    api.create_fleet("gpu-a")
    reg = api.register(api.create_join_token(), gpu_count=3, topology=TOPOLOGY)
    replaced = gpus(3)
    replaced[1]["uuid"] = "GPU-99999999-0000-0000-0000-000000000000"
    api.heartbeat(reg["session_token"], gpus=replaced)
    rt = app.extensions["fleetd"]
    with app.app_context():
        (node,) = current_state(rt).snapshot().nodes
    assert node.links is None


def test_a_heartbeat_with_its_gpus_brings_a_topology_the_registration_lacked(api, app):
    api.create_fleet("gpu-a")
    reg = api.register(api.create_join_token(), gpu_count=3)  # an agent from before topology
    assert api.node(reg["node_id"])["topology"] is None
    api.heartbeat(reg["session_token"], gpus=gpus(3), topology=TOPOLOGY)
    assert api.node(reg["node_id"])["topology"] == TOPOLOGY
    with app.app_context():
        (node,) = current_state(app.extensions["fleetd"]).snapshot().nodes
    assert node.links is not None  # placement sees it at once
    # A topology without the GPUs it links is refused, and the node keeps what it had.
    body = api.heartbeat(reg["session_token"], topology=topology_x3(), expect=400)
    assert "topology comes with gpus" in str(body)
    api.heartbeat(reg["session_token"], gpus=gpus(3))  # without one: the topology stays
    assert api.node(reg["node_id"])["topology"] == TOPOLOGY
