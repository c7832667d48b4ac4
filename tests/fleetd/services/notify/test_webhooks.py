"""Webhooks against a real local HTTP receiver: signature, retries with back-off, the delivery
history."""

import base64
import hashlib
import hmac
import json

import pytest
import standardwebhooks

from tests.conftest import ApiClient, admin_client
from tests.support.webhooks import SECRET, receiver  # noqa: F401 - receiver is a fixture


@pytest.fixture
def env(make_app, clock):
    app = make_app(failover_grace_seconds=0)
    api = admin_client(app, clock)
    api.create_fleet()
    return app, api


def _hook(api, url, events):
    resp = api.post("/api/v1/webhooks", {"url": url, "secret": SECRET, "events": events})
    assert resp.status_code == 201, resp.get_json()
    return resp.get_json()


def _deliveries(api, hook_id):
    resp = api.get(f"/api/v1/webhooks/{hook_id}/deliveries")
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()["items"]


def _signed(headers, body):
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers["X-Fleetd-Signature"], expected)


def test_a_lost_node_is_delivered_signed_and_retried_after_a_500(env, receiver, clock):
    app, api = env
    hook = _hook(api, receiver.url, ["node.lost", "node.returned"])
    assert set(hook) >= {"id", "url", "events"} and "secret" not in hook
    listed = api.get("/api/v1/webhooks").get_json()["items"]
    assert [h["id"] for h in listed] == [hook["id"]] and SECRET not in json.dumps(listed)
    node_id, session = api.ready_node(api.create_join_token(), "host-a")
    assert _deliveries(api, hook["id"]) == []  # joining notifies nobody

    clock.advance(41)
    assert api.run_task("liveness_sweep")["lost"] == 1
    [pending] = _deliveries(api, hook["id"])
    assert (pending["event"], pending["attempts"], pending["status_code"]) == ("node.lost", 0, None)

    receiver.statuses = [500]
    assert api.run_task("webhooks")["retrying"] == 1
    [failed] = _deliveries(api, hook["id"])
    assert (failed["attempts"], failed["status_code"], failed["error"]) == (1, 500, "HTTP 500")
    assert api.run_task("webhooks") == {
        "delivered": 0,
        "retrying": 0,
        "given_up": 0,
        "forgotten": 0,
    }  # backing off
    assert len(receiver.requests) == 1

    clock.advance(5)
    assert api.run_task("webhooks")["delivered"] == 1
    [done] = _deliveries(api, hook["id"])
    assert (done["attempts"], done["status_code"], done["error"], done["state"]) == (
        2,
        204,
        "",
        "delivered",
    )
    assert set(done) >= {"id", "event", "at", "status_code", "attempts", "error"}
    assert len(receiver.requests) == 2
    for path, headers, body in receiver.requests:
        assert path == "/hook" and _signed(headers, body)
        assert headers["Content-Type"] == "application/json"
    first, second = (json.loads(r[2]) for r in receiver.requests)
    assert first == second  # a retry sends the same document (same id: receivers can drop repeats)
    assert set(first) == {"id", "kind", "at", "subject", "data"}
    assert (first["kind"], first["subject"]) == ("node.lost", f"node/{node_id}")
    assert first["data"]["actor"] == "fleetd" and first["data"]["to_status"] == "lost"

    api.heartbeat(session)
    api.run_task("webhooks")
    assert [d["event"] for d in _deliveries(api, hook["id"])] == ["node.lost", "node.returned"]
    assert json.loads(receiver.requests[-1][2])["data"]["actor"] == f"node:{node_id}"
    tampered = receiver.requests[-1][2].replace(b"node.returned", b"node.lost")
    assert not _signed(receiver.requests[-1][1], tampered)


def test_a_receiver_that_keeps_failing_is_given_up_after_bounded_attempts(env, receiver, clock):
    app, api = env
    hook = _hook(api, receiver.url, ["node.drained"])
    node_id, _ = api.ready_node(api.create_join_token(), "host-a")
    assert (
        api.post(
            f"/api/v1/nodes/{node_id}/drain", {"reason": "rma", "deadline_seconds": 60}
        ).status_code
        == 200
    )
    receiver.statuses = [503] * 20
    for attempt in range(1, 9):
        result = api.run_task("webhooks")
        [d] = _deliveries(api, hook["id"])
        assert d["attempts"] == attempt
        clock.advance(3600)
    assert (
        result["given_up"] == 1
        and d["state"] == "failed"
        and d["error"].startswith("gave up after 8 attempts")
    )
    assert api.run_task("webhooks")["given_up"] == 0 and len(receiver.requests) == 8


def test_redirects_are_not_followed(env, receiver):
    app, api = env
    hook = _hook(api, receiver.url, ["node.drained"])
    node_id, _ = api.ready_node(api.create_join_token(), "host-a")
    api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "rma", "deadline_seconds": 60})
    receiver.statuses = [302]
    assert api.run_task("webhooks")["retrying"] == 1
    [d] = _deliveries(api, hook["id"])
    assert d["status_code"] == 302 and "redirects are not followed" in d["error"]


def test_only_subscribed_kinds_are_queued_and_a_deleted_hook_stops(env, receiver, clock):
    app, api = env
    lost = _hook(api, receiver.url, ["node.lost"])
    drained = _hook(api, receiver.url, ["node.drained", "job.failed"])
    node_id, _ = api.ready_node(api.create_join_token(), "host-a")
    api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "rma", "deadline_seconds": 60})
    assert _deliveries(api, lost["id"]) == [] and len(_deliveries(api, drained["id"])) == 1
    assert api.delete(f"/api/v1/webhooks/{drained['id']}").status_code == 204
    assert api.get(f"/api/v1/webhooks/{drained['id']}/deliveries").status_code == 404
    assert api.delete(f"/api/v1/webhooks/{drained['id']}").status_code == 404
    assert api.run_task("webhooks")["delivered"] == 0 and receiver.requests == []


@pytest.mark.parametrize(
    "body, field",
    [
        ({"url": "ftp://127.0.0.1/x"}, "url"),
        ({"url": "http:///nohost"}, "url"),
        ({"url": "https://user:pw@example.com/x"}, "url"),
        ({"url": "not a url"}, "url"),
        ({"url": "http://127.0.0.1:99999/x"}, "url"),
        ({"secret": "short"}, "secret"),
        ({"secret": "x" * 257}, "secret"),
        ({"events": []}, "events"),
        ({"events": ["node.exploded"]}, "events"),
        ({"events": "node.lost"}, "events"),
    ],
)
def test_bad_webhooks_are_refused(api, body, field):
    full = dict(
        {"url": "https://hooks.example.com/fleetd", "secret": SECRET, "events": ["node.lost"]},
        **body,
    )
    resp = api.post("/api/v1/webhooks", full)
    assert resp.status_code == 400, resp.get_json()
    assert field in resp.get_json()["error"]["details"]["fields"]["json"]


def test_webhooks_are_for_admins_only(api, app):
    submitter = ApiClient(app, api.create_token("submitter"))
    assert submitter.get("/api/v1/webhooks").status_code == 403
    assert (
        submitter.post(
            "/api/v1/webhooks",
            {"url": "https://h.example/x", "secret": SECRET, "events": ["node.lost"]},
        ).status_code
        == 403
    )


def test_webhook_kinds_of_events():
    from fleetd.services.notify.webhooks import webhook_kind

    assert webhook_kind("node.status", "ready", "lost") == "node.lost"
    assert webhook_kind("node.status", "lost", "cordoned") == "node.returned"
    assert webhook_kind("node.status", "lost", "revoked") == "node.revoked"
    assert webhook_kind("node.status", "revoked", "pending") == "node.enrolled"
    assert webhook_kind("node.registered", None, "pending") == "node.enrolled"
    assert webhook_kind("node.registered", "ready", "ready") is None
    assert webhook_kind("node.status", "draining", "drained") == "node.drained"
    assert webhook_kind("node.status", "ready", "cordoned") is None
    assert webhook_kind("job.state", "running", "failed") == "job.failed"
    assert webhook_kind("job.state", "running", "succeeded") is None
    assert webhook_kind("rollout.state", "running", "failed") == "rollout.state"
    assert webhook_kind("rollout.state", "paused", "running") is None
    for kind in ("gpu.rma", "gpu.flagged", "gpu.rma_cleared", "node.labels", "node.bootstrap"):
        assert webhook_kind(kind, None, None) == kind
    assert webhook_kind("instance.state", "running", "interrupted") == "instance.interrupted"
    assert webhook_kind("leader.changed", None, None) == "leader.changed"
    assert webhook_kind("task.state", "running", "failed") is None


def test_deliveries_verify_with_the_standard_webhooks_library_and_keep_their_id_across_retries(
    env, receiver, clock
):
    app, api = env
    hook = _hook(api, receiver.url, ["node.drained"])
    node_id, _ = api.ready_node(api.create_join_token(), "host-a")
    assert (
        api.post(
            f"/api/v1/nodes/{node_id}/drain", {"reason": "rma", "deadline_seconds": 60}
        ).status_code
        == 200
    )
    receiver.statuses = [500]
    assert api.run_task("webhooks")["retrying"] == 1
    clock.advance(5)
    assert api.run_task("webhooks")["delivered"] == 1
    [delivery] = _deliveries(api, hook["id"])

    # The receiver's key is the secret's bytes: `whsec_` + base64 of them in the specification's
    # form.
    whsec = "whsec_" + base64.b64encode(SECRET.encode()).decode()
    for verifier in (standardwebhooks.Webhook(whsec), standardwebhooks.Webhook(SECRET.encode())):
        for _path, headers, body in receiver.requests:
            assert verifier.verify(body, headers)["id"] == delivery["id"]
    assert [r[1]["webhook-id"] for r in receiver.requests] == [
        delivery["id"]
    ] * 2  # stable across the retry
    assert all(
        _signed(headers, body) for _path, headers, body in receiver.requests
    )  # the old header stays
    assert all(r[1]["Host"] == receiver.url.split("/")[2] for r in receiver.requests)

    _path, headers, body = receiver.requests[-1]
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(whsec).verify(body.replace(b"node.drained", b"node.lost"), headers)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError, match="too old"):
        standardwebhooks.Webhook(whsec).verify(
            body,
            dict(headers, **{"webhook-timestamp": str(int(headers["webhook-timestamp"]) - 600)}),
        )
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook("whsec_" + base64.b64encode(b"another secret").decode()).verify(
            body, headers
        )


@pytest.mark.parametrize(
    "url",
    [
        "http://[::127.0.0.1]:8080/hook",  # IPv4-compatible (::/96)
        "http://[::ffff:0:127.0.0.1]/hook",  # IPv4-translated (SIIT)
        "http://①②⑦.0.0.1/hook",  # the resolver's IDNA codec reads the circled digits as 127
        "http://127。0。0。1/hook",  # ... and the ideographic full stop as a dot
        "http://１２７．０．０．１:8080/hook",
        "http://ｌｏｃａｌｈｏｓｔ/hook",
    ],
)
def test_webhook_targets_that_the_resolver_reads_as_loopback_are_refused_at_create(
    make_app, clock, url
):
    api = admin_client(make_app(webhooks_allow_targets=""), clock)
    resp = api.post("/api/v1/webhooks", {"url": url, "secret": SECRET, "events": ["node.lost"]})
    assert resp.status_code == 400, resp.get_json()
    error = resp.get_json()["error"]
    assert error["code"] == "invalid_request" and "127.0.0.1" in error["message"], error
    assert error["details"]["fields"]["json"]["url"]
    assert api.get("/api/v1/webhooks").get_json()["items"] == []


def test_an_ipv4_compatible_target_is_judged_by_its_ipv4_address_and_names_stay_unresolved(
    make_app, clock
):
    api = admin_client(make_app(webhooks_allow_targets="127.0.0.0/8"), clock)
    for url in (
        "http://[::127.0.0.1]:8080/hook",
        "https://bücher.example/hook",
        "https://8.8.8.8/x",
    ):
        resp = api.post("/api/v1/webhooks", {"url": url, "secret": SECRET, "events": ["node.lost"]})
        assert resp.status_code == 201, (url, resp.get_json())
    resp = api.post(
        "/api/v1/webhooks",
        {"url": "http://[::10.0.0.1]/", "secret": SECRET, "events": ["node.lost"]},
    )
    assert resp.status_code == 400 and "10.0.0.1" in resp.get_json()["error"]["message"]
    unreadable = (
        "http://" + "ü" * 64 + ".example/hook"
    )  # a label IDNA refuses: no resolver could look it up
    resp = api.post(
        "/api/v1/webhooks", {"url": unreadable, "secret": SECRET, "events": ["node.lost"]}
    )
    assert resp.status_code == 400 and resp.get_json()["error"]["details"]["fields"]["json"]["url"]


def test_a_standard_webhooks_secret_signs_with_its_decoded_key_so_the_receivers_library_verifies(
    env, receiver
):
    app, api = env
    whsec = (
        "whsec_" + base64.b64encode(bytes(range(7, 39))).decode()
    )  # as receivers' libraries make them
    resp = api.post(
        "/api/v1/webhooks", {"url": receiver.url, "secret": whsec, "events": ["node.drained"]}
    )
    assert resp.status_code == 201, resp.get_json()
    node_id, _ = api.ready_node(api.create_join_token(), "host-a")
    api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "rma", "deadline_seconds": 60})
    assert api.run_task("webhooks")["delivered"] == 1
    [(_path, headers, body)] = receiver.requests
    assert standardwebhooks.Webhook(whsec).verify(body, headers)["kind"] == "node.drained"
    unpadded = whsec.rstrip("=")
    assert standardwebhooks.Webhook(unpadded).verify(body, headers)["kind"] == "node.drained"
    # fleetd's own header keeps its contract: the HMAC of the body with the secret as given.
    assert (
        headers["X-Fleetd-Signature"]
        == "sha256=" + hmac.new(whsec.encode(), body, hashlib.sha256).hexdigest()
    )


@pytest.mark.parametrize(
    "secret", ["whsec_this is not base64!!", "whsec_" + base64.b64encode(b"twelve bytes").decode()]
)
def test_a_malformed_standard_webhooks_secret_is_refused_at_create(api, secret):
    resp = api.post(
        "/api/v1/webhooks",
        {"url": "https://hooks.example.com/x", "secret": secret, "events": ["node.lost"]},
    )
    assert resp.status_code == 400, resp.get_json()
    error = resp.get_json()["error"]
    assert error["code"] == "invalid_request" and "whsec_" in error["message"]
    assert error["details"]["fields"]["json"]["secret"]
    assert api.get("/api/v1/webhooks").get_json()["items"] == []
