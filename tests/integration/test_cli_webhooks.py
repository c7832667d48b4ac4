"""`fleetd webhook create|list|rm|deliveries` against a real `fleetd serve` and a real receiver: the
secret the CLI made signs the delivery the receiver gets."""

import base64
import hashlib
import hmac
import json

import pytest
import requests

from tests.conftest import gpus
from tests.integration.conftest import admin, data_dir, server, server_factory  # noqa: F401 - fixtures
from tests.integration.test_cli import run  # noqa: F401 - the fixture
from tests.support import wait_until
from tests.support.webhooks import receiver  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def test_webhook_cli_creates_with_a_made_secret_lists_shows_deliveries_and_removes(run, receiver):  # noqa: F811
    out = run(
        "webhook", "create", receiver.url, "--event", "node.enrolled", "--event", "node.lost"
    ).stdout
    lines = out.strip().splitlines()
    assert lines[0].startswith("created webhook ") and "node.enrolled, node.lost" in lines[0]
    secret = lines[-1]
    assert len(secret) >= 32 and " " not in secret
    hook_id = lines[0].split()[2]
    listed = run("webhook", "list").stdout
    assert hook_id in listed and receiver.url in listed and secret not in listed
    assert json.loads(run("webhook", "list", "--json").stdout)[0]["events"] == [
        "node.enrolled",
        "node.lost",
    ]

    # A node enrols: the receiver gets the event, signed with the secret the CLI made.
    run("fleet", "create", "gpu-a", "--no-validation")
    join = json.loads(run("join-token", "create", "--fleet", "gpu-a", "--json").stdout)["token"]
    reg = requests.post(
        run.url + "/api/v1/agent/register",
        timeout=30,
        json={
            "hostname": "h1",
            "machine_id": "m1",
            "agent_version": "0.1",
            "address": "127.0.0.1",
            "resources": {"cpu_count": 8, "memory_bytes": 2**35},
            "gpus": gpus(1),
        },
        headers={"Authorization": f"Bearer {join}", "X-Fleet-Protocol": "1"},
    )
    assert reg.status_code == 201, reg.text
    wait_until(lambda: receiver.requests, timeout=60, message="the webhook delivery")
    _, headers, body = receiver.requests[0]
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = (
        "v1,"
        + base64.b64encode(hmac.new(secret.encode(), signed, hashlib.sha256).digest()).decode()
    )
    assert headers["webhook-signature"] == expected

    deliveries = wait_until(
        lambda: [
            d
            for d in json.loads(run("webhook", "deliveries", hook_id, "--json").stdout)
            if d["state"] == "delivered"
        ],
        timeout=30,
        message="a delivered delivery",
    )
    assert deliveries[0]["event"] == "node.enrolled" and deliveries[0]["status_code"] == 204
    table = run("webhook", "deliveries", hook_id).stdout
    assert "node.enrolled" in table and "delivered" in table
    run("webhook", "rm", hook_id)
    assert json.loads(run("webhook", "list", "--json").stdout) == []
    missing = run("webhook", "deliveries", hook_id, expect=1)
    assert "not found" in missing.stdout + missing.stderr
    short = run(
        "webhook", "create", receiver.url, "--event", "node.lost", "--secret", "short", expect=1
    )
    assert "secret" in short.stdout + short.stderr
