"""TLS: fleetd pinned by certificate fingerprint or trusted through a CA file; the local API over
TLS."""

import dataclasses
import hashlib
import http.server
import json
import shutil
import ssl
import subprocess
import threading

import pytest
import requests

from agent.client import FleetClient, Unreachable
from agent.config import Config
from agent.daemon import Agent
from agent.localapi import LocalApi
from fleetwire.heartbeat import Heartbeat

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1: (cert path, key path, SHA-256 fingerprint)."""
    root = tmp_path_factory.mktemp("tls")
    cert, key = root / "cert.pem", root / "key.pem"
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
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    der = ssl.PEM_cert_to_DER_cert(cert.read_text())
    return cert, key, hashlib.sha256(der).hexdigest()


class _Heartbeat(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps(
            {
                "status": "ready",
                "drain": None,
                "revoked": False,
                "cancel": [],
                "heartbeat_interval_seconds": 10,
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def tls_server(cert):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Heartbeat)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert[0]), str(cert[1]))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
    )
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_pinned_fingerprint_is_accepted_with_colons_or_without(tls_server, cert):
    pin = cert[2]
    colons = ":".join(pin[i : i + 2] for i in range(0, len(pin), 2)).upper()
    for value in (pin, colons):
        client = FleetClient(tls_server, "fln_x", tls_pin=value, timeout=10)
        assert client.heartbeat(Heartbeat()).status == "ready"
        client.close()


def test_wrong_pin_and_untrusted_certificate_are_refused(tls_server):
    client = FleetClient(tls_server, "fln_x", tls_pin="00" * 32, timeout=10)
    with pytest.raises(Unreachable, match="TLS|ingerprint"):
        client.heartbeat(Heartbeat())
    client.close()
    client = FleetClient(tls_server, "fln_x", timeout=10)
    with pytest.raises(Unreachable, match="TLS"):
        client.heartbeat(Heartbeat())
    client.close()


def test_ca_file_trusts_the_server(tls_server, cert):
    client = FleetClient(tls_server, "fln_x", ca_file=str(cert[0]), timeout=10)
    assert client.heartbeat(Heartbeat()).revoked is False
    client.close()


def test_local_api_serves_https_when_tls_is_configured(tmp_path, cert, fake_nvml):
    config = Config(
        state_dir=str(tmp_path),
        local_api_listen="127.0.0.1:0",
        local_api_tls_cert=str(cert[0]),
        local_api_tls_key=str(cert[1]),
        devices_backend=f"fake:{fake_nvml.use('l4_x4')}",
    ).validate()
    agent = Agent(config)
    agent.devices.discover()
    api = LocalApi(agent, config, "fll_secret").start()
    try:
        assert api.url.startswith("https://")
        resp = requests.get(
            api.url + "/api/v1/devices",
            verify=str(cert[0]),
            timeout=10,
            headers={"Authorization": "Bearer fll_secret"},
        )
        assert resp.status_code == 200 and len(resp.json()["data"]) == 4
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(api.url.replace("https", "http") + "/healthz", timeout=10)
    finally:
        api.stop()
        agent.devices.close()


def test_status_trusts_only_the_local_apis_own_certificate(tmp_path, cert, fake_nvml):
    """`fleet-agent status` sends the local API's token only to the certificate local_api.tls_cert
    names (pinned: whatever address it listens on); another certificate is refused, the token never
    sent."""
    from agent.cli import _ask_local_agent
    from agent.state import State

    state = State(str(tmp_path / "state"))
    token = state.local_api_token()
    config = Config(
        state_dir=state.dir,
        local_api_listen="127.0.0.1:0",
        local_api_tls_cert=str(cert[0]),
        local_api_tls_key=str(cert[1]),
        devices_backend=f"fake:{fake_nvml.use('l4_x4')}",
    ).validate()
    agent = Agent(config)
    agent.devices.discover()
    api = LocalApi(agent, config, token).start()
    try:
        listen = api.url.removeprefix("https://")
        asked = _ask_local_agent(dataclasses.replace(config, local_api_listen=listen), state)
        assert asked["running"] is True and len(asked["gpus"]) == 4
        other = tmp_path / "other.pem"
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
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                str(tmp_path / "k"),
                "-out",
                str(other),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        refused = _ask_local_agent(
            dataclasses.replace(config, local_api_listen=listen, local_api_tls_cert=str(other)),
            state,
        )
        assert (
            refused["running"] is False
            and "gpus" not in refused
            and "another certificate" in refused["error"]
        )
    finally:
        api.stop()
        agent.devices.close()
