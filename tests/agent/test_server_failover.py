"""The agent client's failover between fleetd URLs (replicas), against real local HTTP servers.

Two stand-in fleetds (tests/agent/fakefleetd.py, each on its own loopback port), a closed port
(connection refused), and a port that accepts connections but never answers (a timeout).
"""

import hashlib
import http.server
import logging
import shutil
import socket
import ssl
import threading

import pytest

from agent.client import Conflict, FleetClient, FleetdError, ServerUrls, Unreachable, display_url
from fleetwire.finish import TaskFinish
from fleetwire.heartbeat import Heartbeat
from tests.agent.test_tls import _Heartbeat, cert  # noqa: F401 - the TLS stand-in and its certificate fixture

TOKEN = "fln_s.secret-session-token"
HEARTBEAT = Heartbeat(metrics={})


@pytest.fixture
def dead_url():
    """A loopback port nothing listens on: connection refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def silent_url():
    """A loopback port that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def client(urls, timeout=5.0):
    return FleetClient(
        urls if isinstance(urls, ServerUrls) else ServerUrls(urls), TOKEN, timeout=timeout
    )


def heartbeats(fake):
    return len(fake.paths("POST"))


def switches(caplog):
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "agent.client" and "switching to" in r.getMessage()
    ]


def test_a_dead_first_url_fails_over_to_the_next_within_the_call_and_stays_there(
    fakes, dead_url, caplog
):
    live = fakes[0]
    urls = ServerUrls([dead_url, live.url])
    c = client(urls)
    with caplog.at_level(logging.WARNING, logger="agent.client"):
        assert c.heartbeat(HEARTBEAT).status == "ready"
        assert urls.current == live.url and c.base == live.url
        assert c.heartbeat(HEARTBEAT).status == "ready"
    assert heartbeats(live) == 2
    lines = switches(caplog)
    assert len(lines) == 1, lines  # the second call went straight to the live URL
    assert (
        f"fleetd at {dead_url} failed" in lines[0]
        and f"switching to {live.url} (2 of 2)" in lines[0]
    )
    assert TOKEN not in caplog.text
    c.close()


def test_a_503_moves_to_the_next_url_and_the_next_call_starts_there(fakes, caplog):
    first, second = fakes
    first.down.add("heartbeat")
    urls = ServerUrls([first.url, second.url])
    c = client(urls)
    with caplog.at_level(logging.WARNING, logger="agent.client"):
        c.heartbeat(HEARTBEAT)
        c.heartbeat(HEARTBEAT)
    assert (heartbeats(first), heartbeats(second)) == (1, 2)
    assert urls.index == 1 and len(switches(caplog)) == 1
    assert "503" in switches(caplog)[0]
    # The second goes down too, the first is back: the call goes round to the first.
    second.down.add("heartbeat")
    first.down.clear()
    c.heartbeat(HEARTBEAT)
    assert urls.current == first.url and (heartbeats(first), heartbeats(second)) == (2, 3)
    c.close()


def test_long_polls_and_finish_reports_fail_over_like_any_call(fakes):
    first, second = fakes
    first.down.update({"acquire", "finish"})
    second.assign({"task_id": "t-5"})
    urls = ServerUrls([first.url, second.url])
    c = client(urls)
    assert [a["task_id"] for a in c.acquire(wait_seconds=5, max_assignments=4)] == ["t-5"]
    assert urls.current == second.url
    urls.failed(1)  # back to the first, whose finish route answers 503
    assert c.task_finishes([("t-5", TaskFinish(epoch=1, outcome="succeeded", exit_code=0))]) == [
        None
    ]
    assert second.finished["t-5"]["outcome"] == "succeeded" and "t-5" not in first.finished
    c.close()


def test_a_4xx_is_an_answer_and_moves_nothing(fakes, caplog):
    first, second = fakes
    first.fenced.add("t-1")
    first.strict_acquire = True
    urls = ServerUrls([first.url, second.url])
    c = client(urls)
    with caplog.at_level(logging.WARNING, logger="agent.client"):
        with pytest.raises(Conflict):
            c.task_start("t-1", 1, pid=42)
        with pytest.raises(FleetdError) as refused:
            c.acquire_work(0, max_assignments=4)
        assert refused.value.status == 400 and not isinstance(refused.value, Unreachable)
        # fleetd's 504 for a rendezvous nobody published in time is its answer too, not a failure.
        assert c.wait_rendezvous("t-2", wait_seconds=0) is None
    assert second.calls == [] and urls.index == 0 and switches(caplog) == []
    c.close()


def test_every_url_failing_raises_once_after_one_round(fakes, dead_url):
    first, second = fakes
    first.down.add("heartbeat")
    second.down.add("heartbeat")
    urls = ServerUrls([first.url, dead_url, second.url])
    c = client(urls)
    with pytest.raises(Unreachable) as failed:
        c.heartbeat(HEARTBEAT)
    # Each URL once, in order from the one in use: the caller's back-off comes once per round.
    assert (heartbeats(first), heartbeats(second)) == (1, 1)
    assert failed.value.status == 503 and "every one of the 3 fleetd URLs failed" in str(
        failed.value
    )
    with pytest.raises(Unreachable):
        c.heartbeat(HEARTBEAT)
    assert (heartbeats(first), heartbeats(second)) == (2, 2)
    c.close()


def test_a_single_url_keeps_its_message_and_never_switches(dead_url, caplog):
    urls = ServerUrls(dead_url)
    c = client(urls)
    with caplog.at_level(logging.WARNING, logger="agent.client"):
        with pytest.raises(Unreachable, match="^fleetd unreachable: ") as failed:
            c.heartbeat(HEARTBEAT)
    assert "fleetd URLs failed" not in str(failed.value)
    assert urls.index == 0 and switches(caplog) == []


def test_a_url_that_never_answers_times_out_and_the_call_goes_on_to_the_next(fakes, silent_url):
    live = fakes[0]
    urls = ServerUrls([silent_url, live.url])
    c = client(urls, timeout=0.5)
    assert c.heartbeat(HEARTBEAT).status == "ready"
    assert urls.current == live.url and heartbeats(live) == 1
    # A long poll connects within the request timeout, not its own wait, to a host that is down.
    live.assign({"task_id": "t-9"})
    urls2 = ServerUrls([silent_url, live.url])
    assert [a["task_id"] for a in client(urls2, timeout=0.5).acquire(wait_seconds=1)] == ["t-9"]
    c.close()


def test_artifact_downloads_fail_over_too(fakes, dead_url, tmp_path):
    live = fakes[1]
    data = b"weights" * 1000
    sha = hashlib.sha256(data).hexdigest()
    live.artifacts[sha] = data
    c = client([dead_url, live.url])
    assert c.download_artifact(sha, str(tmp_path / "a.bin")) == len(data)
    assert (tmp_path / "a.bin").read_bytes() == data and c.base == live.url


def test_clients_sharing_the_urls_switch_once_when_they_fail_together(fakes, dead_url, caplog):
    live = fakes[0]
    urls = ServerUrls([dead_url, live.url])
    barrier = threading.Barrier(8)
    results, errors = [], []

    def call():
        c = client(urls)
        try:
            barrier.wait(timeout=10)
            results.append(c.heartbeat(HEARTBEAT).status)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            c.close()

    with caplog.at_level(logging.WARNING, logger="agent.client"):
        threads = [threading.Thread(target=call) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    assert errors == [] and results == ["ready"] * 8
    assert urls.current == live.url and len(switches(caplog)) == 1 and heartbeats(live) == 8


def test_server_urls_switch_only_from_the_url_in_use():
    urls = ServerUrls(["http://a:1/", "http://b:2", "http://c:3"])
    assert urls.urls == ("http://a:1", "http://b:2", "http://c:3") and len(urls) == 3
    urls.failed(0, "refused")
    urls.failed(0, "refused")  # another thread's news of the same failure: no second switch
    assert urls.current == "http://b:2"
    assert urls.next_to_try({1}) == 2 and urls.next_to_try({0, 1, 2}) is None
    urls.failed(1)
    urls.failed(2)
    assert urls.index == 0  # round and round
    with pytest.raises(ValueError):
        ServerUrls([])


def test_credentials_in_a_url_are_never_shown():
    assert display_url("https://user:pw@cp1:8080/x") == "https://cp1:8080/x"
    assert display_url("https://cp1:8080") == "https://cp1:8080"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_tls_pin_applies_to_every_url(cert, dead_url):  # noqa: F811 - the fixture
    servers = []
    for _ in range(2):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Heartbeat)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(cert[0]), str(cert[1]))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        ).start()
        servers.append(server)
    try:
        first, second = (f"https://127.0.0.1:{s.server_address[1]}" for s in servers)
        pinned = FleetClient(
            [dead_url.replace("http:", "https:"), first, second], TOKEN, tls_pin=cert[2], timeout=5
        )
        assert pinned.heartbeat(HEARTBEAT).status == "ready" and pinned.base == first
        servers[0].shutdown()
        servers[0].server_close()
        assert pinned.heartbeat(HEARTBEAT).status == "ready" and pinned.base == second
        wrong = FleetClient([first, second], TOKEN, tls_pin="00" * 32, timeout=5)
        with pytest.raises(Unreachable, match="every one of the 2 fleetd URLs failed"):
            wrong.heartbeat(HEARTBEAT)
    finally:
        for server in servers[1:]:
            server.shutdown()
            server.server_close()
