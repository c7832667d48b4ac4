"""Webhook targets against a real `fleetd serve`: loopback, link-local, private, multicast and
unspecified hosts are refused in every spelling unless `webhooks_allow_targets` allows them, at
create time and again at each delivery; deliveries carry the Standard Webhooks headers."""

import base64
import shutil
import subprocess

import pytest
import standardwebhooks

from tests.support.gpus import gpus
from tests.support.http import Http
from tests.support.server import fleetd_cmd
from tests.support.webhooks import SECRET, Receiver, receiver  # noqa: F401 - receiver is a fixture

pytestmark = pytest.mark.integration  # every test runs a real fleetd serve

NOTHING_ALLOWED = {"FLEETD_WEBHOOKS_ALLOW_TARGETS": ""}

REFUSED = [
    "http://127.0.0.1:18401/",
    "http://2130706433:18401/",
    "http://0x7f.1/",
    "http://0x7f000001/",
    "http://127.1/",
    "http://017700000001/",
    "http://0177.0.0.1/",
    "http://127.0.0.1./",
    "http://localhost:8001/",
    "http://api.localhost/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[0:0:0:0:0:ffff:7f00:1]/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/",
    "http://[fe80::1%25eth0]/",
    "http://10.0.0.1/",
    "http://172.16.5.4/",
    "http://192.168.1.1/",
    "http://[fd00::1]/",
    "http://[fec0::1]/",
    "http://100.64.0.1/",
    "http://224.0.0.1/",
    "http://[ff02::1]/",
    "http://0.0.0.0/",
    "http://0/",
    "http://[::]/",
    "http://0.1.2.3/",
    "http://240.0.0.1/",
    "http://255.255.255.255/",
    "http://[2002:7f00:1::]/",
    "http://[64:ff9b::a00:1]/",
    "https://127.0.0.1/",
]


def _hook_body(url):
    return {"url": url, "secret": SECRET, "events": ["node.drained"]}


def _drained_node(http, name="host-a"):
    """A registered node, drained at once (it runs nothing): one node.drained delivery per
    webhook."""
    http("POST", "/api/v1/fleets", expect=201, json={"name": "lab"})
    join = http("POST", "/api/v1/fleets/lab/join-tokens", expect=201, json={}).json()["token"]
    reg = http(
        "POST",
        "/api/v1/agent/register",
        expect=201,
        agent_token=join,
        json={
            "hostname": name,
            "machine_id": name,
            "agent_version": "0.1.0",
            "address": "10.0.0.1",
            "resources": {"cpu_count": 8, "memory_bytes": 2**34},
            "gpus": gpus(1),
        },
    ).json()
    http(
        "POST",
        "/api/v1/agent/heartbeat",
        expect=200,
        agent_token=reg["session_token"],
        json={"tasks": []},
    )
    http(
        "POST",
        f"/api/v1/nodes/{reg['node_id']}/drain",
        expect=200,
        json={"reason": "rma", "deadline_seconds": 60},
    )
    return reg["node_id"]


def _run_sender(http):
    record = http("POST", "/api/v1/admin/tasks/webhooks/run", expect=200).json()
    assert record["last_status"] == "ok", record
    return record["last_result"]


def test_webhook_targets_on_internal_addresses_are_refused_in_every_spelling(server_factory, admin):
    http = Http(server_factory(**NOTHING_ALLOWED).url, admin)
    for url in REFUSED:
        resp = http("POST", "/api/v1/webhooks", json=_hook_body(url))
        assert resp.status_code == 400, (url, resp.text)
        error = resp.json()["error"]
        assert (
            error["code"] == "invalid_request" and "webhooks_allow_targets" in error["message"]
        ), (url, error)
        assert error["details"]["fields"]["json"]["url"], (url, error)
    assert http("GET", "/api/v1/webhooks", expect=200).json()["items"] == []  # nothing stored
    # Global addresses, and names (not resolved at create: each delivery resolves and checks them),
    # are kept.
    for url in (
        "https://8.8.8.8/hook",
        "http://[2606:4700:4700::1111]:8443/x",
        "https://hooks.example.invalid/x",
    ):
        http("POST", "/api/v1/webhooks", expect=201, json=_hook_body(url))


def test_allowed_networks_admit_a_lan_receiver_and_nothing_else(server_factory, admin):
    http = Http(server_factory(FLEETD_WEBHOOKS_ALLOW_TARGETS="10.1.0.0/16, fd12::/16").url, admin)
    for url in ("http://10.1.2.3/hook", "http://[fd12::5]/hook", "http://[::ffff:10.1.2.3]/hook"):
        http("POST", "/api/v1/webhooks", expect=201, json=_hook_body(url))
    for url in ("http://10.2.0.1/hook", "http://127.0.0.1/hook", "http://[fd13::5]/hook"):
        assert http("POST", "/api/v1/webhooks", json=_hook_body(url)).status_code == 400, url


def test_a_bad_allow_list_stops_fleetd_at_start_up_with_a_clear_error(data_dir):
    proc = subprocess.run(
        fleetd_cmd("serve", "--bind", "127.0.0.1:0", "--data-dir", str(data_dir)),
        capture_output=True,
        text=True,
        timeout=60,
        env={"FLEETD_WEBHOOKS_ALLOW_TARGETS": "10.0.0.0/8,10.0.0.300/32", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode != 0
    assert (
        "webhooks_allow_targets" in proc.stderr
        and "10.0.0.300/32" in proc.stderr
        and "Traceback" not in proc.stderr
    )


def test_a_target_allowed_when_created_is_checked_again_at_each_delivery(
    server_factory, admin, receiver
):
    first = server_factory()  # the test set-up allows 127.0.0.0/8
    http = Http(first.url, admin)
    hook = http("POST", "/api/v1/webhooks", expect=201, json=_hook_body(receiver.url)).json()
    _drained_node(http)
    first.kill()

    http = Http(server_factory(**NOTHING_ALLOWED).url, admin)  # the admin withdrew the allowance
    assert _run_sender(http)["retrying"] == 1
    assert receiver.requests == []
    [delivery] = http("GET", f"/api/v1/webhooks/{hook['id']}/deliveries", expect=200).json()[
        "items"
    ]
    assert delivery["status_code"] is None and delivery["attempts"] == 1
    assert delivery["error"].startswith("refused: the host is 127.0.0.1, a loopback address"), (
        delivery
    )


def test_a_delivery_of_the_running_server_verifies_with_the_standard_webhooks_library(
    server, admin, receiver
):
    http = Http(server.url, admin)
    hook = http("POST", "/api/v1/webhooks", expect=201, json=_hook_body(receiver.url)).json()
    node_id = _drained_node(http)
    assert _run_sender(http)["delivered"] == 1
    [(_path, headers, body)] = receiver.requests
    payload = standardwebhooks.Webhook(
        "whsec_" + base64.b64encode(SECRET.encode()).decode()
    ).verify(body, headers)
    assert (payload["kind"], payload["subject"]) == ("node.drained", f"node/{node_id}")
    [delivery] = http("GET", f"/api/v1/webhooks/{hook['id']}/deliveries", expect=200).json()[
        "items"
    ]
    assert headers["webhook-id"] == payload["id"] == delivery["id"]
    assert SECRET not in server.log


@pytest.mark.parametrize("allow", ["", "127.0.0.0/8"])
def test_a_refused_or_allowed_target_never_answers_500(server_factory, admin, allow):
    http = Http(server_factory(FLEETD_WEBHOOKS_ALLOW_TARGETS=allow).url, admin)
    for url in (
        "http://[::ffff:0:0]/",
        "http://[zz::1]/",
        "http://0x/",
        "http://99999999999/",
        "http://1.2.3.4.5/",
        "http://" + "a" * 64 + ".example/",
        "http://xn--/",
        "http://[::1%25]/",
    ):
        assert http("POST", "/api/v1/webhooks", json=_hook_body(url)).status_code in (201, 400), url


@pytest.fixture
def localhost_cert(tmp_path):
    """A self-signed certificate for the name localhost only (no address): (certificate, key)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_an_https_delivery_to_the_checked_address_still_verifies_the_certificate_by_name(
    server_factory, admin, localhost_cert
):
    tls_receiver = Receiver(tls=localhost_cert)
    try:
        http = Http(server_factory(REQUESTS_CA_BUNDLE=str(localhost_cert[0])).url, admin)
        by_name = http(
            "POST",
            "/api/v1/webhooks",
            expect=201,
            json=_hook_body(f"https://localhost:{tls_receiver.port}/hook"),
        ).json()
        by_address = http(
            "POST", "/api/v1/webhooks", expect=201, json=_hook_body(tls_receiver.url)
        ).json()
        _drained_node(http)
        assert _run_sender(http) == {"delivered": 1, "retrying": 1, "given_up": 0, "forgotten": 0}
        [(path, headers, body)] = tls_receiver.requests
        assert path == "/hook" and headers["Host"] == f"localhost:{tls_receiver.port}"
        assert (
            "localhost" in tls_receiver.server_names
        )  # SNI names the host, though fleetd dialled 127.0.0.1
        [refused] = http(
            "GET", f"/api/v1/webhooks/{by_address['id']}/deliveries", expect=200
        ).json()["items"]
        assert refused["error"].startswith("SSLError"), (
            refused
        )  # the certificate does not name 127.0.0.1
        [sent] = http("GET", f"/api/v1/webhooks/{by_name['id']}/deliveries", expect=200).json()[
            "items"
        ]
        assert sent["state"] == "delivered"
    finally:
        tls_receiver.close()
