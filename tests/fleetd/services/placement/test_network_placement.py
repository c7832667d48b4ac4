"""Gangs over network blocks through the API (issue 50): nodes placed by their
topology.fleetd/block and leaf labels or by their fleet's Slurm topology file, network.same_block
required and preferred, the file refused with its wrong line. Real API, the agents played by
hand."""

BLOCK = "topology.fleetd/block"
LEAF = "topology.fleetd/leaf"


def _nodes(api, hosts, labels=lambda host: {}):
    """A ready 2-GPU node per hostname, with the labels `labels(host)` gives."""
    token = api.create_join_token()
    for host in hosts:
        reg = api.register(token, machine_id=host, hostname=host, labels=labels(host))
        api.heartbeat(reg["session_token"])


def _simulate(api, body):
    resp = api.post("/api/v1/cluster/simulate-schedule", body)
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


def _required_gang(k):
    """A gang of k 2-GPU ranks that requires one block."""
    return {
        "name": f"g{k}",
        "command": ["true"],
        "num_nodes": k,
        "resources": {"gpus": 2},
        "network": {"same_block": "required"},
    }


def _blocks_of(api, job_id):
    hosts = {n["id"]: n["hostname"] for n in api.get("/api/v1/nodes").get_json()["items"]}
    return sorted(hosts[t["node_id"]][0] for t in api.job(job_id)["tasks"])


def test_a_gang_goes_to_the_block_that_holds_it_and_a_required_one_waits_with_a_reason(api):
    api.create_fleet()
    # block a: a1..a2 (first in the order), block b: b1..b4
    hosts = ["a1", "a2", "b1", "b2", "b3", "b4"]
    _nodes(api, hosts, lambda h: {BLOCK: f"blk-{h[0]}", LEAF: f"leaf-{h[0]}"})
    gang = {"name": "g", "command": ["true"], "num_nodes": 3, "resources": {"gpus": 2}}
    sim = _simulate(api, gang)
    assert {p["block"] for p in sim["placement"]} == {"blk-b"}
    assert "all 3 ranks in block blk-b" in sim["placement"][0]["network_note"]

    job = api.submit(**gang)
    assert job["state"] == "running" and _blocks_of(api, job["id"]) == ["b", "b", "b"]
    assert "in block blk-b, leaf leaf-b" in api.job(job["id"])["tasks"][0]["reason"]

    required = dict(gang, name="r", network={"same_block": "required"})
    sim = _simulate(api, required)
    assert not sim["schedulable"] and "same_block required" in sim["reason"]
    assert {d["stage"] for d in sim["filter_detail"]} >= {"network"}
    waiting = api.submit(**required)
    assert waiting["state"] == "queued"
    assert "one network block of 3" in api.job(waiting["id"])["pending_reason"]
    assert api.job(waiting["id"])["spec"]["network"] == {"same_block": "required"}

    preferred = api.submit(**dict(gang, name="p"))  # a1, a2 and b4: two blocks, the fewest
    assert preferred["state"] == "running" and _blocks_of(api, preferred["id"]) == ["a", "a", "b"]


def test_a_fleets_topology_file_places_its_nodes_and_labels_win_over_it(api):
    tree = (
        "SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodes=n[3-5]\nSwitchName=top Switches=s[1-2]\n"
    )
    api.create_fleet(network_topology=tree)
    # n3 is in s2 by the file but its label puts it in a block of its own
    _nodes(api, ["n1", "n2", "n3", "n4", "n5"], lambda h: {BLOCK: "other"} if h == "n3" else {})
    sim = _simulate(api, _required_gang(2))
    assert sim["schedulable"]
    assert {(p["block"], p["leaf"]) for p in sim["placement"]} in ({("s1", "s1")}, {("s2", "s2")})
    three = _simulate(api, _required_gang(3))
    assert not three["schedulable"] and "2 (s1)" in three["reason"]


def test_a_bad_topology_file_is_refused_with_the_line_that_is_wrong(api):
    api.create_fleet()
    resp = api.patch(
        "/api/v1/fleets/gpu-a",
        {"network_topology": "SwitchName=s1 Nodes=n[1-2]\nSwitchName=top Switches=s9\n"},
    )
    assert resp.status_code == 400
    assert "line 2" in str(resp.get_json()) and "s9 is not defined" in str(resp.get_json())
    good = "BlockName=b1 Nodes=n[01-18]"
    resp = api.patch("/api/v1/fleets/gpu-a", {"network_topology": good})
    assert resp.status_code == 200 and resp.get_json()["network_topology"] == good
    resp = api.patch("/api/v1/fleets/gpu-a", {"network_topology": None})
    assert resp.status_code == 200 and resp.get_json()["network_topology"] is None
