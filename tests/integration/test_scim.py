"""SCIM 2.0 against a real `fleetd serve`: scim2-tester's checks of RFC 7643/7644, then what a
provider's provisioning does to fleetd's users: groups that feed the binding rules, deactivation
that ends a user's tokens at once, and users fleetd did not get through SCIM left alone."""

import pytest
import requests

pytestmark = pytest.mark.integration

USER = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
ERROR = "urn:ietf:params:scim:api:messages:2.0:Error"


class Api:
    def __init__(self, url, token):
        self.url, self.headers = url, {"Authorization": f"Bearer {token}"}

    def call(self, method, path, body=None, **headers):
        return requests.request(
            method,
            self.url + path,
            json=body,
            headers={**self.headers, **headers},
            timeout=30,
        )


@pytest.fixture
def scim_token(server, admin):
    made = Api(server.url, admin).call("POST", "/api/v1/tokens", {"name": "idp", "role": "scim"})
    assert made.status_code == 201, made.text
    return made.json()["token"]


def test_scim2_tester_finds_the_server_compliant(server, scim_token):
    # scim2-tester's client runs on httpx2, which needs Python 3.11 (setup.cfg installs it there).
    httpx2 = pytest.importorskip("httpx2", reason="httpx2 needs Python 3.11")
    from scim2_client.engines.httpx2 import SyncSCIMClient
    from scim2_tester import Status, check_server

    with httpx2.Client(
        base_url=server.url + "/scim/v2",
        headers={"Authorization": f"Bearer {scim_token}"},
        timeout=30,
    ) as http:
        client = SyncSCIMClient(http)
        results = check_server(client, raise_exceptions=False)
    failed = [
        (r.title, r.reason) for r in results if r.status not in (Status.SUCCESS, Status.SKIPPED)
    ]
    assert not failed, failed
    assert sum(r.status == Status.SUCCESS for r in results) > 20


def test_provisioning_binds_deactivates_and_leaves_other_users_alone(server, admin, scim_token):
    api, scim = Api(server.url, admin), Api(server.url, scim_token)
    assert api.call("POST", "/api/v1/projects", {"key": "vision", "team": "ml"}).ok
    rules = [
        {
            "provider": "scim",
            "claim": "scim_groups",
            "contains": "ml-vision",
            "role": "member",
            "team": "ml",
            "projects": [{"project": "vision", "role": "member"}],
        }
    ]
    assert api.call("PUT", "/api/v1/auth/bindings", rules).status_code == 200

    made = scim.call(
        "POST",
        "/scim/v2/Users",
        {
            "schemas": [USER],
            "userName": "Carol.Baker@lab.example",
            "externalId": "00u1",
            "name": {"givenName": "Carol", "familyName": "Baker"},
            "emails": [{"value": "carol.baker@lab.example", "primary": True}],
        },
    )
    assert made.status_code == 201, made.text
    assert made.headers["Content-Type"].startswith("application/scim+json")
    carol = made.json()
    assert made.headers["Location"] == carol["meta"]["location"]
    user = api.call("GET", "/api/v1/users/carol.baker").json()
    assert (user["source"], user["role"], user["display_name"], user["email"]) == (
        "scim",
        "none",  # no rule gives it a role yet: it may do nothing
        "Carol Baker",
        "carol.baker@lab.example",
    )

    # The same userName again, in another case: a uniqueness conflict.
    again = scim.call(
        "POST", "/scim/v2/Users", {"schemas": [USER], "userName": "carol.baker@LAB.example"}
    )
    assert (again.status_code, again.json()["scimType"]) == (409, "uniqueness")
    # A user fleetd did not get through SCIM (a break-glass admin's) is not SCIM's to take.
    ops = {"name": "ops laptop", "role": "admin", "user": "ops"}
    assert api.call("POST", "/api/v1/tokens", ops).status_code == 201
    taken = scim.call("POST", "/scim/v2/Users", {"schemas": [USER], "userName": "ops@lab.example"})
    assert (taken.status_code, taken.json()["scimType"]) == (409, "uniqueness")
    assert scim.call("GET", '/scim/v2/Users?filter=userName eq "ops"').json()["totalResults"] == 0
    assert api.call("GET", "/api/v1/users/ops").json()["active"] is True

    group = scim.call(
        "POST",
        "/scim/v2/Groups",
        {"schemas": [GROUP], "displayName": "ml-vision", "members": [{"value": carol["id"]}]},
    )
    assert group.status_code == 201, group.text
    user = api.call("GET", "/api/v1/users/carol.baker").json()
    assert (user["role"], user["team"], user["default_project"]) == ("member", "ml", "vision")
    found = scim.call("GET", '/scim/v2/Users?filter=userName eq "carol.baker@lab.example"').json()
    assert found["totalResults"] == 1
    assert found["Resources"][0]["groups"][0]["display"] == "ml-vision"

    token = api.call(
        "POST", "/api/v1/tokens", {"name": "carol laptop", "role": "member", "user": "carol.baker"}
    )
    assert token.status_code == 201, token.text
    carol_api = Api(server.url, token.json()["token"])
    assert carol_api.call("GET", "/api/v1/whoami").status_code == 200

    # The provider takes carol out of the group: her role goes at once.
    out = scim.call(
        "PATCH",
        f"/scim/v2/Groups/{group.json()['id']}",
        {
            "schemas": [PATCH],
            "Operations": [{"op": "remove", "path": f'members[value eq "{carol["id"]}"]'}],
        },
    )
    assert out.status_code == 200, out.text
    assert api.call("GET", "/api/v1/users/carol.baker").json()["role"] == "none"
    assert carol_api.call("GET", "/api/v1/jobs").status_code == 403

    # Deactivated (Entra's way: a string "False"): her next request is refused.
    off = scim.call(
        "PATCH",
        f"/scim/v2/Users/{carol['id']}",
        {"schemas": [PATCH], "Operations": [{"op": "Replace", "path": "active", "value": "False"}]},
    )
    assert (off.status_code, off.json()["active"]) == (200, False)
    refused = carol_api.call("GET", "/api/v1/whoami")
    assert refused.status_code == 401

    # Deleted: gone from SCIM, kept (inactive) by fleetd; made again, it is the same user.
    assert scim.call("DELETE", f"/scim/v2/Users/{carol['id']}").status_code == 204
    assert scim.call("GET", f"/scim/v2/Users/{carol['id']}").status_code == 404
    back = scim.call(
        "POST", "/scim/v2/Users", {"schemas": [USER], "userName": "carol.baker@lab.example"}
    )
    assert (back.status_code, back.json()["id"]) == (201, carol["id"])
    assert api.call("GET", "/api/v1/users/carol.baker").json()["active"] is True
    assert carol_api.call("GET", "/api/v1/whoami").status_code == 401  # its tokens stay revoked


def test_errors_are_scim_errors_and_other_roles_are_refused(server, admin, scim_token):
    scim, api = Api(server.url, scim_token), Api(server.url, admin)
    for response, status in (
        (scim.call("GET", "/scim/v2/Users", Authorization="Bearer fla_nope.nope"), 401),
        (api.call("GET", "/scim/v2/Users"), 403),  # an admin's token is not the provider's
        (scim.call("GET", "/scim/v2/Users?filter=userName eq"), 400),
        (scim.call("GET", "/scim/v2/Users/nope"), 404),
        (scim.call("POST", "/scim/v2/Users", {"schemas": [USER]}), 400),
        (scim.call("POST", "/scim/v2/ServiceProviderConfig", {}), 405),
        (scim.call("GET", "/scim/v2/nowhere"), 404),
        (
            scim.call(
                "POST",
                "/scim/v2/Groups",
                {"schemas": [GROUP], "displayName": "x", "members": [{"value": "nobody"}]},
            ),
            400,
        ),
    ):
        assert response.status_code == status, response.text
        body = response.json()
        assert body["schemas"] == [ERROR] and body["status"] == str(status), body
    bad = requests.post(
        server.url + "/scim/v2/Users",
        data=b"{not json",
        headers={**scim.headers, "Content-Type": "application/scim+json"},
        timeout=30,
    )
    assert (bad.status_code, bad.json()["scimType"]) == (400, "invalidSyntax")
    # Nothing of the refused writes was kept.
    assert scim.call("GET", "/scim/v2/Users").json()["totalResults"] == 0
    assert scim.call("GET", "/scim/v2/Groups").json()["totalResults"] == 0
