"""A small stand-in for fleetd's agent-protocol routes, on a real loopback socket.

It records every call and can be told to misbehave: answer 503 (an outage), 409 for a task
(fencing), 413 over a body size, hold log requests (a slow fleetd), serve wrong artifact bytes.
The real server is exercised by the end-to-end tests; this one lets the runner and the daemon's
work loop be tested on their own, with exact control over fleetd's answers.
"""

import http.server
import json
import re
import threading
import time
import urllib.parse

from tests.support import wait_until


class FakeFleetd:
    """The server state and knobs; `url` once started."""

    def __init__(self):
        self.cond = threading.Condition()
        self.calls = []  # (method, path, body) in arrival order
        self.logs = {}  # task_id -> [[stream, text], ...] in delivery order
        self.log_batches = {}  # task_id -> [number of lines per accepted batch]
        self.finished = {}  # task_id -> finish body
        # task_id -> start body (the last one: an instance's restarts report theirs)
        self.started = {}
        self.restarts = {}  # task_id -> [restart body, ...]
        self.rendezvous = {}  # task_id -> {addr, port}
        self.artifacts = {}  # sha256 -> bytes served
        self.assignments = []  # queued for acquire
        self.heartbeats = []  # heartbeat bodies
        self.cancel = set()  # task ids listed in the heartbeat's cancel
        self.revoked = False  # the heartbeat says the node was revoked
        # Instance ids the heartbeat's reply asks the node to delete the volumes of.
        self.delete_volumes = []
        self.strict_finish = (
            False  # refuse (400) a finish with fields fleetd may not know, like `lost`
        )
        self.strict_start = False  # refuse (400) a start saying when, as an older fleetd would
        self.strict_acquire = (
            False  # refuse (400) an acquire asking for a batch, as an older fleetd would
        )
        # Take several finish reports in one call (POST /agent/finish); older fleetds do not.
        self.finish_batches = True
        self.hold_finish = threading.Event()  # while clear, finish calls wait (bounded) for it
        self.hold_finish.set()
        self.fenced = set()  # task ids answered 409
        self.down = (
            set()
        )  # routes answered 503: "finish", "logs", "start", "acquire", "heartbeat", "all"
        self.lease_seconds = (
            None  # told in heartbeat replies when set (the agent stops job tasks past it)
        )
        self.max_log_body = None  # bytes; larger log bodies get 413
        self.hold_logs = threading.Event()  # while clear, log requests wait (bounded) for it
        self.hold_logs.set()
        self.rendezvous_wait_cap = 30.0  # the longest a rendezvous GET waits before 504
        self.gangs = {}  # task_id -> gang key: the ranks of one job share a rendezvous
        self._server = None
        self.url = None

    # Control.

    def start(self):
        self._server = _Server(("127.0.0.1", 0), self)
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def stop(self):
        self.hold_logs.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def assign(self, assignment):
        with self.cond:
            self.assignments.append(assignment)
            self.cond.notify_all()

    def wait_for(self, predicate, timeout=30.0, message="condition"):
        """Wait until predicate() (called under the lock) is truthy, looking again at every call;
        bounded."""
        with self.cond:
            return wait_until(
                predicate,
                timeout,
                0.5,
                message,
                pause=self.cond.wait,
                details=lambda: f"calls: {[c[:2] for c in self.calls][-20:]}",
            )

    def wait_finished(self, task_id, timeout=30.0):
        return self.wait_for(lambda: self.finished.get(task_id), timeout, f"finish of {task_id}")

    def wait_outcome(self, task_id, timeout=30.0):
        """The finish body without the start it may carry (`pid`, `started_seconds_ago`: a process
        that ended within the agent's start-report delay)."""
        return {
            k: v
            for k, v in self.wait_finished(task_id, timeout).items()
            if k not in ("pid", "started_seconds_ago")
        }

    def texts(self, task_id, stream=None):
        with self.cond:
            return [
                line[1]
                for line in self.logs.get(task_id, [])
                if stream is None or line[0] == stream
            ]

    def paths(self, method=None):
        with self.cond:
            return [c[1] for c in self.calls if method is None or c[0] == method]

    # Handling, under the lock unless it waits.

    def handle(self, method, path, query, body, raw_size):
        with self.cond:
            self.calls.append((method, path, body))
            self.cond.notify_all()
        if path.endswith("/finish"):
            for _ in range(600):
                if self.hold_finish.wait(0.1):
                    break
        match = re.match(r"^/api/v1/agent/tasks/(?P<id>[^/]+)/(?P<action>\w+)$", path)
        if match:
            return self._task(
                method, urllib.parse.unquote(match["id"]), match["action"], query, body, raw_size
            )
        if path == "/api/v1/agent/acquire":
            return self._acquire(body)
        if path == "/api/v1/agent/heartbeat":
            return self._heartbeat(body)
        if path == "/api/v1/agent/finish" and method == "POST" and self.finish_batches:
            return self._finishes(body)
        match = re.match(r"^/api/v1/artifacts/(?P<sha>[^/]+)$", path)
        if match and method == "GET":
            data = self.artifacts.get(match["sha"])
            if data is None:
                return 404, {"error": {"code": "not_found", "message": "no such artifact"}}
            return 200, data
        return 404, {"error": {"code": "not_found", "message": f"no route {path}"}}

    def _is_down(self, route):
        return route in self.down or "all" in self.down

    def _task(self, method, task_id, action, query, body, raw_size):
        if self._is_down(action):
            return 503, {"error": {"code": "unavailable", "message": "down for the test"}}
        epoch = (body or {}).get("epoch")
        if task_id in self.fenced and not (action == "rendezvous" and method == "GET"):
            return 409, {"error": {"code": "conflict", "message": f"stale epoch {epoch}"}}
        if action == "logs":
            for _ in range(600):
                if self.hold_logs.wait(0.1):
                    break
            if self.max_log_body is not None and raw_size > self.max_log_body:
                return 413, {
                    "error": {"code": "payload_too_large", "message": "log batch too large"}
                }
            with self.cond:
                self.logs.setdefault(task_id, []).extend(body["lines"])
                self.log_batches.setdefault(task_id, []).append(len(body["lines"]))
                self.cond.notify_all()
            return 204, None
        if action == "start":
            if self.strict_start and set(body) - {"epoch", "pid", "ports", "restarts"}:
                return 400, {"error": {"code": "invalid_request", "message": "unknown field"}}
            with self.cond:
                self.started[task_id] = body
                self.cond.notify_all()
            return 204, None
        if action == "restart":
            with self.cond:
                self.restarts.setdefault(task_id, []).append(body)
                self.cond.notify_all()
            return 204, None
        if action == "finish":
            if self.strict_finish and set(body) - {"epoch", "outcome", "exit_code", "reason"}:
                return 400, {"error": {"code": "invalid_request", "message": "unknown field"}}
            with self.cond:
                if "pid" in body:  # the start, reported with the finish (as fleetd records it)
                    self.started.setdefault(task_id, {"epoch": body["epoch"], "pid": body["pid"]})
                self.finished[task_id] = body
                self.cond.notify_all()
            return 204, None
        gang = self.gangs.get(task_id, task_id)
        if action == "rendezvous" and method == "POST":
            with self.cond:
                self.rendezvous[gang] = {"addr": body["addr"], "port": body["port"]}
                self.cond.notify_all()
            return 204, None
        if action == "rendezvous" and method == "GET":
            wait = min(float(query.get("wait_seconds", ["0"])[0]), self.rendezvous_wait_cap)
            deadline = time.monotonic() + wait
            with self.cond:
                while gang not in self.rendezvous and time.monotonic() < deadline:
                    self.cond.wait(deadline - time.monotonic())
                found = self.rendezvous.get(gang)
            if found is None:
                return 504, {
                    "error": {"code": "timeout", "message": "rendezvous not published yet"}
                }
            return 200, found
        return 404, {"error": {"code": "not_found", "message": "no such task route"}}

    def _finishes(self, body):
        """Each report answered as a call of its own would be (fleetd's reply shape)."""
        if self._is_down("finish"):
            return 503, {"error": {"code": "unavailable", "message": "down for the test"}}
        results = []
        for report in body["finishes"]:
            report = dict(report)
            task_id = report.pop("task_id")
            status, payload = self._task("POST", task_id, "finish", {}, report, 0)
            results.append(
                {
                    "task_id": task_id,
                    "status": status,
                    "error": payload["error"] if payload else None,
                }
            )
        return 200, {"results": results}

    def _acquire(self, body):
        if self._is_down("acquire"):
            return 503, {"error": {"code": "unavailable", "message": "down for the test"}}
        if self.strict_acquire and set(body) - {"wait_seconds"}:
            return 400, {"error": {"code": "invalid_request", "message": "unknown field"}}
        deadline = time.monotonic() + min(float(body.get("wait_seconds", 0)), 30)
        batch = body.get("max_assignments")
        with self.cond:
            while not self.assignments and time.monotonic() < deadline:
                self.cond.wait(deadline - time.monotonic())
            taken = self.assignments[: batch or 1]
            del self.assignments[: len(taken)]
        reply = {"assignment": taken[0] if taken else None}
        if batch is not None:
            reply["assignments"] = taken
        return 200, reply

    def _heartbeat(self, body):
        if self._is_down("heartbeat"):
            return 503, {"error": {"code": "unavailable", "message": "down for the test"}}
        with self.cond:
            self.heartbeats.append(body)
            reported = {t["id"] for t in body.get("tasks", [])}
            cancel = sorted(self.cancel & reported)
            self.cond.notify_all()
        reply = {
            "status": "revoked" if self.revoked else "ready",
            "drain": None,
            "revoked": self.revoked,
            "cancel": cancel,
            "delete_volumes": list(self.delete_volumes),
            "heartbeat_interval_seconds": 1,
        }
        if self.lease_seconds is not None:
            reply["lease_seconds"] = self.lease_seconds
        return 200, reply


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802
        self._handle("GET")

    def do_POST(self):  # noqa: N802
        self._handle("POST")

    def _handle(self, method):
        parsed = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        if parsed.path.startswith("/api/v1/agent/") and self.headers.get("X-Fleet-Protocol") != "1":
            status, payload = (
                400,
                {"error": {"code": "protocol_mismatch", "message": "X-Fleet-Protocol: 1"}},
            )
        else:
            status, payload = self.server.fake.handle(
                method, parsed.path, urllib.parse.parse_qs(parsed.query), body, len(raw)
            )
        if isinstance(payload, bytes):
            data, kind = payload, "application/octet-stream"
        else:
            data, kind = (
                (b"" if payload is None else json.dumps(payload).encode()),
                "application/json",
            )
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt, *args):
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, fake):
        self.fake = fake
        super().__init__(address, _Handler)

    def handle_error(self, request, client_address):
        # A killed agent or a client that gave up on a long poll is part of these tests, not an
        # error.
        pass
