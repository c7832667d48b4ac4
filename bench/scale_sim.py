#!/usr/bin/env python3
"""Simulated fleet-agents for bench/scale.py: N nodes in one gevent process, registered through
the agent API and heartbeating at the interval fleetd gives them.

Cheap on the client side: no process or thread per node. One greenlet per pooled keep-alive
connection sends the requests (hand-written HTTP/1.1, no HTTP library: the load generator shares
the cores with fleetd); a dispatcher hands out heartbeats in order of when each node's agent would
send its next one (after the reply, the interval fleetd last gave +/- 10 %, as agent/daemon.py
does). Each heartbeat's latency is measured from that due time, so a heartbeat that waits for a
free connection here is counted as late, not hidden.

Control on stdin, one word a line: `report` prints the figures since the last report as one JSON
line on stdout and starts a new window; `stop` (or end of input) prints the last window and exits;
`mark` starts counting the nodes answered from now on, and prints `{"event": "all_heard"}` once
every registered node has had a heartbeat answered since (bench/storms.py: when a storm of
returning nodes is over). The first line on stdout is the registration's figures.

    .venv/bin/python bench/scale_sim.py --url http://127.0.0.1:8080 --join flj_... --nodes 1000
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import heapq  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import select  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402

import gevent  # noqa: E402
import gevent.queue  # noqa: E402
from scale import percentiles  # noqa: E402 - bench/ is this script's directory; scale.py imports only the stdlib

GPU_MODEL = "NVIDIA H100 80GB HBM3"
NOT_SERIOUS = ("ready",)  # reply statuses that are what a healthy idle node should see


class HttpError(Exception):
    """A reply fleetd gave, but not the one wanted."""

    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status = status


class Connection:
    """One keep-alive HTTP/1.1 connection: POST a JSON body, read a Content-Length reply."""

    def __init__(self, host, port, timeout):
        self.host, self.port, self.timeout = host, port, timeout
        self.sock = None
        self.buf = b""
        self.retry_after = None  # the last reply's Retry-After in seconds, when it had one

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None
                self.buf = b""

    def post(self, path, auth, body):
        """(status, body bytes); raises OSError on a broken connection (then closed)."""
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.sock.sendall(
                b"POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                b"X-Fleet-Protocol: 1\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (path, self.host.encode(), auth, len(body), body)
            )
            return self._read()
        except Exception:
            self.close()
            raise

    def _recv(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("fleetd closed the connection")
        self.buf += chunk

    def _read(self):
        for _ in range(10_000):
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            self._recv()
        else:
            raise ConnectionError("reply headers too long")
        head, self.buf = self.buf[:end].lower(), self.buf[end + 4 :]
        status = int(head[9:12])
        at = head.find(b"\ncontent-length:")
        if at < 0:
            raise ConnectionError(f"reply without Content-Length: {head[:200]!r}")
        line_end = head.find(b"\r", at + 1)
        length = int(head[at + 16 : line_end if line_end > 0 else len(head)])
        for _ in range(100_000):
            if len(self.buf) >= length:
                break
            self._recv()
        body, self.buf = self.buf[:length], self.buf[length:]
        at = head.find(b"\nretry-after:")
        self.retry_after = None
        if at >= 0:
            line_end = head.find(b"\r", at + 1)
            value = head[at + 13 : line_end if line_end > 0 else len(head)].strip()
            self.retry_after = float(value) if value.isdigit() else None
        if b"\nconnection: close" in head:
            self.close()
        return status, body


class Window:
    """What happened since the last report."""

    def __init__(self):
        self.started = time.monotonic()
        self.cpu = _cpu()
        self.latency = []  # due -> reply: what the agent would see
        self.service = []  # sent -> reply: fleetd and the network only
        self.late = []  # due -> sent: waiting here for a free connection
        self.failures = {}  # kind -> count
        self.statuses = {}  # reply status other than ready -> count
        self.intervals = {}  # heartbeat_interval_seconds in replies -> count
        self.max_gap = 0.0  # the longest silence between two answered heartbeats of one node
        self.gaps_over_ttl = 0
        self.max_queue = 0

    def add(self, due, sent, done, gap, reply, ttl):
        """One answered heartbeat: due, sent and answered at these monotonic times, `gap` after the
        last."""
        self.latency.append(done - due)
        self.service.append(done - sent)
        self.late.append(sent - due)
        self.max_gap = max(self.max_gap, gap)
        if gap > ttl:
            self.gaps_over_ttl += 1
        status = reply.get("status")
        if status not in NOT_SERIOUS or reply.get("revoked"):
            key = "revoked" if reply.get("revoked") else str(status)
            self.statuses[key] = self.statuses.get(key, 0) + 1
        interval = reply.get("heartbeat_interval_seconds")
        if interval:
            self.intervals[interval] = self.intervals.get(interval, 0) + 1

    def summary(self, ttl):
        wall = time.monotonic() - self.started
        return {
            "seconds": round(wall, 2),
            "heartbeats": len(self.latency),
            "per_s": round(len(self.latency) / wall, 1) if wall else None,
            "latency": percentiles(self.latency),
            "service": percentiles(self.service),
            "late": percentiles(self.late),
            "failures": self.failures,
            "statuses": self.statuses,
            "intervals": {str(k): v for k, v in self.intervals.items()},
            "max_gap_s": round(self.max_gap, 2),
            "gaps_over_ttl_s": ttl,
            "gaps_over_ttl": self.gaps_over_ttl,
            "max_queue": self.max_queue,
            "client_cpu_percent": round(100 * (_cpu() - self.cpu) / wall, 1) if wall else None,
        }


def _cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Fleet:
    """N simulated nodes: their session tokens, intervals and when each is due next."""

    def __init__(self, args):
        # Several URLs (replicas): each connection starts at one of them in turn and moves to the
        # next when its replica stops answering, as an agent with a server_url list does.
        self.servers = [
            (split.hostname, split.port or 80)
            for split in map(urllib.parse.urlsplit, args.url.split(","))
        ]
        self.args = args
        self.rng = random.Random(args.seed)
        self.tokens = [None] * args.nodes
        self.interval = [None] * args.nodes
        self.last_ok = [None] * args.nodes
        self.failed = [0] * args.nodes
        self.revoked = 0
        self.due = []  # heap of (monotonic due time, node index)
        self.queue = gevent.queue.Queue()
        self.window = Window()
        self.total = None  # every heartbeat after the registration
        self.stopping = False
        self.mark_at = None  # `mark`: nodes answered since then, until all were
        self.heard = set()

    def sinks(self):
        return (self.window,) if self.total is None else (self.window, self.total)

    def body(self, i):
        gpus = [
            {
                "uuid": f"GPU-sim-{i:06d}-{k}",
                "index": k,
                "model": GPU_MODEL,
                "memory_total_bytes": 80 << 30,
                "numa_node": k // 4,
            }
            for k in range(8)
        ]
        return json.dumps(
            {
                "hostname": f"{self.args.prefix}-{i:06d}",
                "machine_id": f"{self.args.prefix}-{i:06d}",
                "agent_version": "bench-sim",
                "address": "127.0.0.1",
                "resources": {"cpu_count": 128, "memory_bytes": 2 << 40},
                "gpus": gpus,
            }
        ).encode()

    def register_all(self):
        """Register every node, `register_concurrency` at a time; returns the figures."""
        latencies, failures, nxt = [], {}, iter(range(self.args.nodes))
        deferred = {}  # registrations fleetd answered with Retry-After, by status
        join = self.args.join.encode()
        started = time.monotonic()
        deadline = started + self.args.register_timeout

        def worker():
            at = next(turns)
            conn = Connection(*self.servers[at % len(self.servers)], 60)
            for i in nxt:
                body = self.body(i)
                attempt = 0
                for _ in range(1_000_000):  # bounded by the deadline
                    if time.monotonic() > deadline:
                        failures["deadline"] = failures.get("deadline", 0) + 1
                        return
                    t0 = time.monotonic()
                    try:
                        status, reply = conn.post(b"/api/v1/agent/register", join, body)
                        if status in (429, 503) and conn.retry_after is not None:
                            # fleetd admits so many a second: back then, as fleet-agent join does
                            deferred[status] = deferred.get(status, 0) + 1
                            gevent.sleep(conn.retry_after + random.uniform(0.0, 1.0))
                            continue
                        if status != 201:
                            raise HttpError(status, reply)
                    except (OSError, HttpError) as exc:
                        kind = (
                            f"http {exc.status}"
                            if isinstance(exc, HttpError)
                            else type(exc).__name__
                        )
                        failures[kind] = failures.get(kind, 0) + 1
                        if isinstance(exc, OSError):
                            at += 1
                            conn.close()
                            conn = Connection(*self.servers[at % len(self.servers)], 60)
                        attempt += 1
                        if attempt == 5:
                            break
                        gevent.sleep(min(8, 0.5 * 2**attempt))
                        continue
                    now = time.monotonic()
                    latencies.append(now - t0)
                    data = json.loads(reply)
                    self.tokens[i] = data["session_token"].encode()
                    self.interval[i] = float(data.get("heartbeat_interval_seconds") or 10)
                    self.last_ok[i] = now
                    heapq.heappush(self.due, (now, i))  # the agent heartbeats at once after joining
                    break
            conn.close()

        turns = iter(range(self.args.register_concurrency))
        workers = [gevent.spawn(worker) for _ in range(self.args.register_concurrency)]
        gevent.joinall(workers)
        wall = time.monotonic() - started
        return {
            "event": "registered",
            "nodes": sum(t is not None for t in self.tokens),
            "wanted": self.args.nodes,
            "seconds": round(wall, 2),
            "per_s": round(len(latencies) / wall, 1) if wall else None,
            "concurrency": self.args.register_concurrency,
            "latency": percentiles(latencies),
            "failures": failures,
            "told_to_come_back": deferred,
            "interval_s": sorted({x for x in self.interval if x is not None}),
        }

    def dispatch(self):
        """Hand each node to a connection when its next heartbeat is due."""
        while not self.stopping:
            now = time.monotonic()
            while self.due and self.due[0][0] <= now:
                self.queue.put(heapq.heappop(self.due))
            for w in self.sinks():
                w.max_queue = max(w.max_queue, self.queue.qsize())
            wait = self.due[0][0] - now if self.due else 0.05
            gevent.sleep(min(0.05, max(0.001, wait)))

    def heartbeat_worker(self, at=0):
        conn = Connection(*self.servers[at % len(self.servers)], self.args.request_timeout)
        body = b'{"tasks": []}'
        while not self.stopping:
            try:
                due, i = self.queue.get(timeout=0.5)
            except gevent.queue.Empty:
                continue
            sent = time.monotonic()
            try:
                status, reply = conn.post(b"/api/v1/agent/heartbeat", self.tokens[i], body)
                if status != 200:
                    raise HttpError(status, reply)
                data = json.loads(reply)
            except (OSError, HttpError, ValueError) as exc:
                kind = f"http {exc.status}" if isinstance(exc, HttpError) else type(exc).__name__
                for w in self.sinks():
                    w.failures[kind] = w.failures.get(kind, 0) + 1
                self.failed[i] += 1
                if (
                    isinstance(exc, OSError) and len(self.servers) > 1
                ):  # that replica is gone: the next one
                    at += 1
                    conn.close()
                    conn = Connection(
                        *self.servers[at % len(self.servers)], self.args.request_timeout
                    )
                if isinstance(exc, HttpError) and exc.status == 401:
                    self.revoked += 1  # the session is gone: this agent would stop
                    continue
                done = time.monotonic()
                # The agent's backoff: 1 s, doubling, at most the interval.
                heapq.heappush(
                    self.due, (done + min(self.interval[i], 2 ** min(self.failed[i] - 1, 6)), i)
                )
                continue
            done = time.monotonic()
            self.failed[i] = 0
            if self.mark_at is not None:
                self.heard.add(i)
                if len(self.heard) >= sum(t is not None for t in self.tokens) - self.revoked:
                    emit(
                        {
                            "event": "all_heard",
                            "seconds": round(done - self.mark_at, 2),
                            "nodes": len(self.heard),
                        }
                    )
                    self.mark_at = None
            gap = done - self.last_ok[i]
            self.last_ok[i] = done
            for w in self.sinks():
                w.add(due, sent, done, gap, data, self.args.ttl)
            interval = data.get("heartbeat_interval_seconds")
            if interval:
                self.interval[i] = float(interval)
            if data.get("revoked"):
                continue
            heapq.heappush(self.due, (done + self.interval[i] * self.rng.uniform(0.9, 1.1), i))
        conn.close()

    def report(self, final=False):
        summary = self.window.summary(self.args.ttl)
        if final and self.total is not None:
            summary["since_registration"] = self.total.summary(self.args.ttl)
        summary["event"] = "final" if final else "report"
        summary["nodes"] = sum(t is not None for t in self.tokens)
        summary["revoked_or_unauthorized"] = self.revoked
        # Silence right now: a node whose last answered heartbeat is older than the TTL.
        now = time.monotonic()
        summary["silent_over_ttl_now"] = sum(
            1 for t in self.last_ok if t is not None and now - t > self.args.ttl
        )
        self.window = Window()
        emit(summary)


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def read_commands(fleet, deadline):
    """Lines from stdin: report | stop. End of input or the deadline stops."""
    pending = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([0], [], [], 1.0)
        if not ready:
            continue
        chunk = os.read(0, 4096)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            word = line.strip().decode()
            if word == "report":
                fleet.report()
            elif word == "mark":
                fleet.mark_at, fleet.heard = time.monotonic(), set()
            elif word == "stop":
                return


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", required=True, help="fleetd's URL, or its replicas' URLs separated by commas"
    )
    parser.add_argument("--join", required=True, help="a join token of the simulated nodes' fleet")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--prefix", default="sim")
    parser.add_argument("--register-concurrency", type=int, default=16)
    parser.add_argument("--register-timeout", type=float, default=3600)
    parser.add_argument(
        "--connections", type=int, default=256, help="keep-alive connections for heartbeats"
    )
    parser.add_argument("--request-timeout", type=float, default=30)
    parser.add_argument(
        "--ttl", type=float, default=30, help="a silence this long is counted (fleetd's node TTL)"
    )
    parser.add_argument(
        "--max-seconds", type=float, default=7200, help="stop by itself after this long"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    deadline = time.monotonic() + args.max_seconds
    fleet = Fleet(args)
    # Heartbeats start as nodes register: the dispatcher and connections run during registration.
    greenlets = [gevent.spawn(fleet.dispatch)] + [
        gevent.spawn(fleet.heartbeat_worker, k) for k in range(args.connections)
    ]
    emit(fleet.register_all())
    fleet.report()  # the heartbeats sent while registering
    fleet.total = Window()
    try:
        read_commands(fleet, deadline)
    finally:
        fleet.stopping = True
        gevent.joinall(greenlets, timeout=args.request_timeout + 5)
        fleet.report(final=True)


if __name__ == "__main__":
    main()
