"""A node's labels from two sources (issue 35, 5): those set through PATCH /nodes/{id} win per key,
the agent's config file (registration, heartbeats) fills the rest, and dropping one set through the
API shows the agent's again. Real API, the agent's side played by hand."""


def test_labels_set_through_the_api_win_per_key_over_the_agents_and_survive_its_reports(api, clock):
    api.create_fleet("gpu-a")
    reg = api.register(api.create_join_token(), labels={"rack": "a", "zone": "x"})
    node_id, session = reg["node_id"], reg["session_token"]
    api.heartbeat(session)
    assert api.patch(f"/api/v1/nodes/{node_id}", {"labels": {"rack": "b"}}).status_code == 200
    api.heartbeat(session, agent_version="0.1.0", labels={"rack": "c", "zone": "y", "gpu": "h100"})
    node = api.node(node_id)
    assert node["labels"] == {"rack": "b", "zone": "y", "gpu": "h100"}
    assert node["agent_labels"] == {"rack": "c", "zone": "y", "gpu": "h100"} and node[
        "label_overrides"
    ] == {"rack": "b"}
    api.patch(f"/api/v1/nodes/{node_id}", {"labels": {"rack": None}})
    assert api.node(node_id)["labels"] == {"rack": "c", "zone": "y", "gpu": "h100"}
    # The same host registering again (its agent silent past the TTL) keeps what was set through the
    # API.
    api.patch(f"/api/v1/nodes/{node_id}", {"labels": {"zone": "z"}})
    clock.advance(60)
    api.register(api.create_join_token(), labels={"zone": "x"})
    assert api.node(node_id)["labels"] == {"zone": "z"}
