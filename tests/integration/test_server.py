"""`fleetd serve` as a real process: crash safety, graceful shutdown, many concurrent
connections."""

import json
import os
import signal
import socket
import sqlite3
import time

import pytest
import requests

from tests.support import wait_until
from tests.support.gpus import gpus
from tests.support.http import Http

pytestmark = pytest.mark.integration


def _register(http, join, machine_id):
    body = {
        "hostname": machine_id,
        "machine_id": machine_id,
        "agent_version": "0.1.0",
        "address": "127.0.0.1",
        "resources": {"cpu_count": 4, "memory_bytes": 2**34},
        "gpus": gpus(2),
    }
    return http("POST", "/api/v1/agent/register", expect=201, agent_token=join, json=body).json()


def _session(http, fleet, machine_id):
    """A node session of a fresh fleet: (join token, session token)."""
    http("POST", "/api/v1/fleets", expect=201, json={"name": fleet})
    join = http("POST", f"/api/v1/fleets/{fleet}/join-tokens", expect=201, json={}).json()["token"]
    return join, _register(http, join, machine_id)["session_token"]


def test_sigkill_loses_nothing_that_was_acknowledged(server_factory, admin, data_dir):
    server = server_factory()
    http = Http(server.url, admin)
    fleets = [f"fleet-{i}" for i in range(5)]
    for name in fleets:
        http("POST", "/api/v1/fleets", expect=201, json={"name": name})
    tokens = [
        http(
            "POST", "/api/v1/tokens", expect=201, json={"name": f"t{i}", "role": "submitter"}
        ).json()["token"]
        for i in range(5)
    ]
    join = http(
        "POST", "/api/v1/fleets/fleet-0/join-tokens", expect=201, json={"max_uses": 10}
    ).json()
    nodes = [_register(http, join["token"], f"machine-{i}") for i in range(5)]
    http(
        "POST",
        "/api/v1/agent/heartbeat",
        expect=200,
        agent_token=nodes[0]["session_token"],
        json={},
    )
    http("POST", f"/api/v1/nodes/{nodes[0]['node_id']}/cordon", expect=200)

    server.signal(signal.SIGKILL)
    assert server.wait() == -signal.SIGKILL

    con = sqlite3.connect(data_dir / "fleetd.db")
    try:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        con.close()
    restarted = server_factory()
    http = Http(restarted.url, admin)
    assert {f["name"] for f in http("GET", "/api/v1/fleets", expect=200).json()["items"]} == set(
        fleets
    )
    for token in tokens:
        assert (
            Http(restarted.url, token)("GET", "/api/v1/whoami", expect=200).json()["role"]
            == "submitter"
        )
    listed = http("GET", "/api/v1/fleets/fleet-0/join-tokens", expect=200).json()["items"]
    assert listed[0]["uses"] == 5
    for node in nodes:
        reply = http(
            "POST",
            "/api/v1/agent/heartbeat",
            expect=200,
            agent_token=node["session_token"],
            json={"tasks": []},
        )
        assert reply.json()["status"] == ("cordoned" if node is nodes[0] else "ready")


def test_sigterm_lets_an_in_flight_request_finish_then_exits(server, admin, server_factory):
    http = Http(server.url, admin)
    http("GET", "/api/v1/health", expect=200)  # leaves an idle keep-alive connection behind
    body = b'{"name": "created-during-shutdown"}'
    sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=30)
    try:
        # With Expect: 100-continue the server says "100 Continue" once the app reads the body,
        # so the request is provably in flight when SIGTERM arrives.
        sock.sendall(
            b"POST /api/v1/fleets HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\n"
            + f"Authorization: Bearer {admin}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        assert sock.recv(1024).startswith(b"HTTP/1.1 100 Continue")
        server.signal(signal.SIGTERM)
        server.wait_for_line("shutting down", timeout=10)
        sock.sendall(body)
        reply = sock.recv(65536).decode()
    finally:
        sock.close()
    assert reply.startswith("HTTP/1.1 201"), reply
    assert server.wait(timeout=30) == 0
    assert "stopped" in server.log
    restarted = server_factory()
    Http(restarted.url, admin)("GET", "/api/v1/fleets/created-during-shutdown", expect=200)


def test_sigterm_answers_a_waiting_long_poll_at_once_and_exits(server_factory, admin):
    server = server_factory(FLEETD_SHUTDOWN_TIMEOUT_SECONDS="60")
    _join, session = _session(Http(server.url, admin), "lab", "poller")
    sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=30)
    try:
        body = b'{"wait_seconds": 30}'
        sock.sendall(
            b"POST /api/v1/agent/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"X-Fleet-Protocol: 1\r\nExpect: 100-continue\r\n"
            + f"Authorization: Bearer {session}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        assert sock.recv(1024).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)  # the acquire now waits for an assignment (up to 30 s)
        server.signal(signal.SIGTERM)
        reply = b""
        for _ in range(
            100
        ):  # headers and body may come in separate segments; until the server closes
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    finally:
        sock.close()
    reply = reply.decode()
    assert reply.startswith("HTTP/1.1 200") and '"assignment":null' in reply.replace(" ", ""), reply
    # The shutdown waits for in-flight requests up to 60 s here: it did not wait for the poll's 30
    # s.
    assert server.wait(timeout=25) == 0


def test_holds_a_thousand_concurrent_requests_without_a_thread_each(server, admin):
    """1,000 clients each hold an unfinished request open; fleetd still answers, with few
    threads."""
    held = []
    try:
        for _ in range(1000):
            sock = socket.create_connection(
                ("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=10
            )
            sock.sendall(
                b"POST /api/v1/agent/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
            )
            held.append(sock)
        resp = Http(server.url, admin)("GET", "/api/v1/whoami", expect=200)
        assert resp.json()["role"] == "admin"
        with open(f"/proc/{server.proc.pid}/status") as fh:
            threads = int(next(line for line in fh if line.startswith("Threads:")).split()[1])
        assert threads < 50, threads
        with open(f"/proc/{server.proc.pid}/net/tcp") as fh:
            established = sum(1 for line in fh if line.split()[3] == "01")
        assert established >= 1000
    finally:
        for sock in held:
            sock.close()


def test_debug_log_never_contains_tokens(server_factory, admin):
    server = server_factory(FLEETD_LOG_LEVEL="DEBUG")
    http = Http(server.url, admin)
    join, session = _session(http, "gpu-a", "m-1")
    http(
        "GET",
        "/api/v1/whoami",
        headers={"Authorization": "Bearer fla_" + "0" * 20 + ".leaked-secret-guess"},
    )
    server.signal(signal.SIGTERM)
    assert server.wait() == 0
    assert "GET /api/v1/whoami" in server.log  # the access log is there ...
    for secret in (admin, join, session, "leaked-secret-guess"):
        assert secret.split(".")[-1] not in server.log  # ... and holds no secret
    assert os.stat(server.data_dir).st_mode & 0o077 == 0


def _raw_exchange(server, head):
    """Send one raw request head (no body) and return the whole reply, read until fleetd closes."""
    sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=30)
    try:
        sock.sendall(head)
        reply = b""
        for _ in range(100):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
        return reply.decode("latin-1")
    finally:
        sock.close()


def test_request_headers_are_parsed_with_http_limits(server, admin):
    base = "GET /api/v1/whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    ok = _raw_exchange(
        server, f"{base}aUTHORIZATION: Bearer {admin}\r\n\r\n".encode()
    )  # names: any case
    assert ok.startswith("HTTP/1.1 200") and '"role":"admin"' in ok.replace(" ", ""), ok
    # 100 headers are fine, 101 are not; nor is a line over 64 KiB, one without a colon or a name,
    # one with space before its colon, or a folded one.
    many = "".join(f"X-Filler-{i}: {i}\r\n" for i in range(97))
    assert _raw_exchange(
        server, f"{base}Authorization: Bearer {admin}\r\n{many}\r\n".encode()
    ).startswith("HTTP/1.1 200")
    too_many = many + "X-One-More: 1\r\n"
    for bad in (
        too_many,
        f"X-Long: {'a' * 65536}\r\n",
        "no colon here\r\n",
        "X-Folded: a\r\n b\r\n",
        "X-Spaced : a\r\n",
        ": no name\r\n",
    ):
        reply = _raw_exchange(server, f"{base}Authorization: Bearer {admin}\r\n{bad}\r\n".encode())
        assert reply.startswith("HTTP/1.1 400"), reply[:200]
    # Chunked bodies still work (the Content-Length that came with them is dropped).
    body = b'{"name": "chunky"}'
    reply = _raw_exchange(
        server,
        (
            f"POST /api/v1/fleets HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Authorization: Bearer {admin}\r\nContent-Type: application/json\r\n"
            f"Content-Length: 999\r\nTransfer-Encoding: chunked\r\n\r\n"
            f"{len(body):x}\r\n"
        ).encode()
        + body
        + b"\r\n0\r\n\r\n",
    )
    assert reply.startswith("HTTP/1.1 201") and "chunky" in reply, reply[:300]


def test_requests_refused_before_the_app_still_get_the_error_envelope(server, admin):
    reply = _raw_exchange(
        server, f"GET /api/v1/fleets/{'x' * 9000} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    )
    head, _, body = reply.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 414") and "Content-Type: application/json" in head, reply[:300]
    assert json.loads(body)["error"]["code"] == "invalid_request"
    reply = _raw_exchange(server, b"GET /api/v1/health HTTP/1.1\r\nno colon\r\n\r\n")
    assert (
        reply.startswith("HTTP/1.1 400")
        and json.loads(reply.partition("\r\n\r\n")[2])["error"]["message"]
    )


def test_a_client_that_never_finishes_its_headers_is_cut_off(server_factory, admin):
    server = server_factory(
        FLEETD_HTTP_HEADER_TIMEOUT_SECONDS="1", FLEETD_HTTP_IDLE_TIMEOUT_SECONDS="2"
    )
    port = int(server.url.rsplit(":", 1)[1])
    slow = socket.create_connection(("127.0.0.1", port), timeout=15)
    idle = socket.create_connection(("127.0.0.1", port), timeout=15)
    try:
        slow.sendall(
            b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: "
        )  # and never the end of it
        started = time.monotonic()
        reply = slow.recv(65536).decode("latin-1")
        assert reply.startswith("HTTP/1.1 408") and time.monotonic() - started < 10, reply[:200]
        assert (
            idle.recv(1) == b""
        )  # a connection that never sent a request is closed after the idle timeout
        # Keep-alive is unaffected: a client that sends promptly gets its answers.
        assert Http(server.url, admin)("GET", "/api/v1/whoami").status_code == 200
    finally:
        slow.close()
        idle.close()


def test_hostile_graphql_documents_are_refused_while_health_and_heartbeats_answer(server, admin):
    """The audit's documents against a real fleetd: each is refused naming its limit, and the
    event loop answers /health and a node's heartbeats all the while (a document that held it,
    like 2^26 fragment spreads did for about 4 minutes, would leave a probe unanswered)."""
    import concurrent.futures

    from tests.fleetd.gql.test_graphql import doubling, wide

    http = Http(server.url, admin)
    _, session = _session(http, "gql", "gql-host")
    documents = [
        doubling(26),
        doubling(60, "myself { id }"),
        wide(1000, 11),
        " ".join(f"query q{i} {{ __typename }}" for i in range(20000)),
        "{ " + " ".join(f"a{i}: __typename" for i in range(40000)) + " }",
        "{ " + "__typename @skip(if: false) " * 20000 + "}",
    ] * 3
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        sent = [
            pool.submit(Http(server.url, admin), "POST", "/graphql", json={"query": d})
            for d in documents
        ]
        probes = 0
        while not all(f.done() for f in sent) and probes < 200:
            probe = requests.get(server.url + "/api/v1/health", timeout=5)
            assert probe.status_code == 200
            http(
                "POST",
                "/api/v1/agent/heartbeat",
                expect=200,
                agent_token=session,
                json={"tasks": []},
            )
            probes += 1
        answers = [f.result() for f in sent]
    for document, answer in zip(documents, answers):
        error = answer.json()["errors"][0]
        assert answer.status_code == 400 and "limit" in error["message"], (document[:80], error)


def _port(server):
    return int(server.url.rsplit(":", 1)[1])


def test_a_body_that_trickles_in_is_cut_at_its_deadline_and_the_connection_closed(
    server_factory, admin
):
    """A client sending its body a byte at a time (the audit's slow POSTs stayed open past 75 s) is
    answered 408 in the error envelope once the body timeout (here 2 s, plus 1 s per 100 bytes at
    the rate set) has passed, and its connection is closed; a whole body sent at once is served."""
    server = server_factory(
        FLEETD_HTTP_BODY_TIMEOUT_SECONDS="2", FLEETD_HTTP_BODY_MIN_BYTES_PER_SECOND="100"
    )
    body = b'{"name": "slow-fleet", "description": "' + b"x" * 60 + b'"}'
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=30) as sock:
        sock.sendall(
            b"POST /api/v1/fleets HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {admin}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        reply = b""
        for i in range(40):  # a byte every 0.25 s: 10 s for the whole body, past its 2.7 s deadline
            try:
                sock.sendall(body[i : i + 1])
            except OSError:
                break
            time.sleep(0.25)
            sock.setblocking(False)
            try:
                reply += sock.recv(65536)
            except BlockingIOError:
                pass
            finally:
                sock.setblocking(True)
            if reply:
                break
        sock.settimeout(10)
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 408"), reply
        assert (
            b'"code":"invalid_request"' in reply.replace(b" ", b"")
            and b"did not arrive in time" in reply
        )
        assert sock.recv(65536) == b""  # closed
    http = Http(server.url, admin)
    http(
        "POST",
        "/api/v1/fleets",
        expect=201,
        data=body,
        headers={"Content-Type": "application/json"},
    )
    assert "slow-fleet" in {
        f["name"] for f in http("GET", "/api/v1/fleets", expect=200).json()["items"]
    }


def test_one_address_holds_at_most_its_share_of_connections(server_factory, admin):
    """Past max_connections_per_address, a further connection from that address is answered 503 with
    Retry-After and closed; once one closes, the address is served again."""
    server = server_factory(FLEETD_MAX_CONNECTIONS_PER_ADDRESS="5")
    held = [socket.create_connection(("127.0.0.1", _port(server)), timeout=10) for _ in range(5)]
    try:
        for sock in held:  # each inside an unfinished request, so that the server counts it now
            sock.sendall(
                b"POST /api/v1/agent/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
            )
        with socket.create_connection(("127.0.0.1", _port(server)), timeout=10) as extra:
            reply = b""
            while chunk := extra.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in reply, reply
        assert (
            b'"code": "unavailable"' in reply and b"too many connections from this address" in reply
        )
        held.pop().close()
        wait_until(
            lambda: Http(server.url, admin)("GET", "/api/v1/whoami").status_code == 200,
            10,
            0.1,
            "a connection served once one closed",
        )
    finally:
        for sock in held:
            sock.close()
