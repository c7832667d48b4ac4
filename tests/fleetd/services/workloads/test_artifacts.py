"""Artifacts are readable by the tokens that uploaded them, by admins, and by nodes running tasks
that use them."""

import hashlib

from tests.conftest import ApiClient


def _upload(api, token, data, name="a.txt"):
    resp = api.call(
        "PUT", "/api/v1/artifacts", token=token, data=data, headers={"X-Artifact-Name": name}
    )
    assert resp.status_code == 201, resp.get_json()
    return resp.get_json()["sha256"]


def test_a_submitter_cannot_read_another_submitters_artifact(api):
    alice, bob = api.create_token("submitter", "alice"), api.create_token("submitter", "bob")
    sha = _upload(api, alice, b"alice's weights")
    assert sha == hashlib.sha256(b"alice's weights").hexdigest()
    assert api.get(f"/api/v1/artifacts/{sha}", token=alice).data == b"alice's weights"
    resp = api.get(f"/api/v1/artifacts/{sha}", token=bob)
    assert resp.status_code == 404 and resp.get_json()["error"]["code"] == "not_found"
    assert api.get(f"/api/v1/artifacts/{sha}").status_code == 200  # the admin reads every artifact


def test_uploading_the_same_bytes_makes_them_readable_to_both_uploaders(api):
    alice, bob = api.create_token("submitter", "alice"), api.create_token("submitter", "bob")
    sha = _upload(api, alice, b"shared")
    assert _upload(api, bob, b"shared", name="b.txt") == sha
    assert ApiClient(api.app, bob).get(f"/api/v1/artifacts/{sha}").status_code == 200


def test_a_token_with_the_same_name_as_the_uploader_reads_nothing(api):
    first = api.create_token("submitter", "ci")
    sha = _upload(api, first, b"x")
    [first_id] = [
        t["id"] for t in api.get("/api/v1/tokens").get_json()["items"] if t["name"] == "ci"
    ]
    assert api.delete(f"/api/v1/tokens/{first_id}").status_code == 204  # the name is free again
    second = api.create_token("submitter", "ci")
    assert api.get(f"/api/v1/artifacts/{sha}", token=second).status_code == 404


def test_a_job_may_use_only_artifacts_its_token_may_read(api):
    alice, bob = api.create_token("submitter", "alice"), api.create_token("submitter", "bob")
    sha = _upload(api, alice, b"alice's data")
    resp = ApiClient(api.app, bob).post(
        "/api/v1/jobs",
        {"name": "j", "command": ["true"], "artifacts": [{"sha256": sha, "path": "in/data"}]},
    )
    assert resp.status_code == 400 and resp.get_json()["error"]["details"]["fields"][
        "artifacts"
    ] == [sha]
    assert (
        ApiClient(api.app, alice).submit(artifacts=[{"sha256": sha, "path": "in/data"}])["state"]
        == "queued"
    )
    assert (
        api.submit(artifacts=[{"sha256": sha, "path": "in/data"}])["state"] == "queued"
    )  # an admin may
