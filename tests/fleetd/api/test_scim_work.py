"""What SCIM deactivation does to a user's work, per `scim_deactivated_work`: `keep` lets its
queued and running jobs go on, `stop` cancels them in the same request."""

import pytest

from tests.conftest import admin_client

USER = "urn:ietf:params:scim:schemas:core:2.0:User"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
JOB = {"name": "train", "command": ["true"], "resources": {"gpus": 1}}


@pytest.mark.parametrize("setting, state", [("keep", "queued"), ("stop", "cancelled")])
def test_deactivation_keeps_or_stops_the_users_work(make_app, clock, setting, state):
    app = make_app(scim_deactivated_work=setting)
    admin = admin_client(app, clock)
    rules = [
        {
            "provider": "scim",
            "claim": "scim_groups",
            "contains": "ml",
            "role": "member",
            "projects": [{"project": "default", "role": "member"}],
        }
    ]
    assert admin.put("/api/v1/auth/bindings", rules).status_code == 200
    scim = admin.create_token("scim")
    made = admin.call(
        "POST", "/scim/v2/Users", token=scim, json={"schemas": [USER], "userName": "dana"}
    )
    assert made.status_code == 201, made.get_json()
    dana_id = made.get_json()["id"]
    group = {
        "schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group"],
        "displayName": "ml",
        "members": [{"value": dana_id}],
    }
    assert admin.call("POST", "/scim/v2/Groups", token=scim, json=group).status_code == 201
    made = admin.post("/api/v1/tokens", {"name": "dana cli", "role": "member", "user": "dana"})
    dana = made.get_json()["token"]
    job = admin.call("POST", "/api/v1/jobs", token=dana, json=JOB)
    assert job.status_code == 201, job.get_json()

    off = {"schemas": [PATCH], "Operations": [{"op": "replace", "value": {"active": False}}]}
    answer = admin.call("PATCH", f"/scim/v2/Users/{dana_id}", token=scim, json=off)
    assert answer.status_code == 200, answer.get_json()
    assert admin.call("GET", "/api/v1/whoami", token=dana).status_code == 401
    assert admin.job(job.get_json()["id"])["state"] == state
