"""GET /api/v1/fleets/{name}/terraform-state: a fleet's nodes as a Terraform state document, which
Terraform's http backend reads at plan time (with the token as HTTP Basic's password)."""

import base64

from tests.conftest import ApiClient


def _basic(token, user="terraform"):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()}


def test_the_state_maps_each_node_of_the_fleet_to_its_status(api):
    api.create_fleet()
    ready, _ = api.ready_node(api.create_join_token(), "host-a")
    revoked, _ = api.ready_node(api.create_join_token(), "host-b")
    assert api.post(f"/api/v1/nodes/{revoked}/revoke").status_code == 200
    api.create_fleet("other")
    api.ready_node(api.create_join_token("other"), "host-c")
    resp = api.get("/api/v1/fleets/gpu-a/terraform-state", token=None, headers=_basic(api.token))
    assert resp.status_code == 200, resp.get_json()
    state = resp.get_json()
    assert state["version"] == 4 and state["resources"] == []
    nodes = state["outputs"]["nodes"]
    assert nodes["type"][0] == "map"
    assert set(nodes["value"]) == {ready, revoked}  # the other fleet's node is not there
    assert (
        nodes["value"][ready]["status"] == "ready" and nodes["value"][ready]["hostname"] == "host-a"
    )
    assert nodes["value"][revoked]["status"] == "revoked"
    assert (
        api.get("/api/v1/fleets/gpu-a/terraform-state").get_json() == state
    )  # a bearer token works too


def test_basic_credentials_are_taken_there_alone_and_checked_like_a_bearer_token(api, app):
    api.create_fleet()
    anon = ApiClient(app)
    submitter = api.create_token("submitter", name="ci-bot")
    cases = [
        ("/api/v1/fleets/gpu-a/terraform-state", _basic("fla_not.a-token"), 401),
        ("/api/v1/fleets/gpu-a/terraform-state", {"Authorization": "Basic %%%"}, 401),
        (
            "/api/v1/fleets/gpu-a/terraform-state",
            {"Authorization": "Basic " + base64.b64encode(b"\xff").decode()},
            401,
        ),
        ("/api/v1/fleets/gpu-a/terraform-state", _basic(submitter), 403),
        ("/api/v1/fleets/gpu-a", _basic(api.token), 401),  # Basic is for Terraform's backend only
        ("/api/v1/fleets/no-such-fleet/terraform-state", _basic(api.token), 404),
    ]
    for path, headers, status in cases:
        resp = anon.get(path, headers=headers)
        assert resp.status_code == status, (path, headers, resp.get_json())
        assert set(resp.get_json()) == {"error"}
