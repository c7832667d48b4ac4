"""A small stand-in for fleetd's agent-protocol routes, on a real loopback socket.

It records every call and can be told to misbehave: answer 503 (an outage), 409 for a task
(fencing), 413 over a body size, hold output batches or chunk uploads (a slow fleetd), serve wrong
artifact bytes. A task's output arrives as OutputBatches (POST .../logs) and chunks (PUT
.../output/{first_line}); `texts()` puts the lines of both together, as fleetd serves them.
The real server is exercised by the end-to-end tests; this one lets the runner and the daemon's
work loop be tested on their own, with exact control over fleetd's answers.
"""

import http.server
import json
import re
import threading
import time
import urllib.parse

from fleetwire.output import (
    CHUNK_RAW_BYTES,
    MAX_LINE_BYTES,
    ChunkMeta,
    OutputBatch,
    decompress_chunk,
    iter_lines,
)
from tests.support import wait_until


def line_text(raw):
    """A whole line's text as fleetd shows it (utf-8 with replacements, no NUL, no CR)."""
    return raw.removesuffix(b"\r").decode("utf-8", "replace").replace("\0", "\ufffd")


class FakeFleetd:
    """The server state and knobs; `url` once started."""

    def __init__(self):
        self.cond = threading.Condition()
        self.calls = []  # (method, path, body) in arrival order
        self.logs = {}  # task_id -> {line number: [stream, text]} from batches and chunks
        self.batches = {}  # task_id -> [OutputBatch, ...] accepted, in order
        self.log_batches = {}  # task_id -> [number of texts per accepted batch]
        self.chunks = {}  # task_id -> {first_line: (ChunkMeta, [(at_ms, stream, bytes), ...])}
        self.chunk_puts = {}  # task_id -> [first_line of each accepted upload, in order]
        self.hold_chunks = threading.Event()  # while clear, chunk uploads wait (bounded) for it
        self.hold_chunks.set()
        self.finished = {}  # task_id -> finish body
        # task_id -> start body (the last one: an instance's restarts report theirs)
        self.started = {}
        self.restarts = {}  # task_id -> [restart body, ...]
        self.rendezvous = {}  # task_id -> {addr, port}
        self.artifacts = {}  # sha256 -> bytes served
        self.assignments = []  # queued for acquire
        self.heartbeats = []  # heartbeat bodies
        self.refused_heartbeats = []  # heartbeat bodies refused (refuse_topology)
        self.cancel = set()  # task ids listed in the heartbeat's cancel
        self.revoked = False  # the heartbeat says the node was revoked
        # Instance ids the heartbeat's reply asks the node to delete the volumes of.
        self.delete_volumes = []
        self.strict_finish = (
            False  # refuse (400) a finish with fields fleetd may not know, like `lost`
        )
        self.strict_start = False  # refuse (400) a start saying when, as an older fleetd would
        # refuse (400) a heartbeat with a GPU topology, as a fleetd older than the field would
        self.refuse_topology = False
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
        )  # routes answered 503: "finish", "logs", "output", "start", "acquire", "heartbeat", "all"
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
        self.hold_chunks.set()
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
        that ended within the agent's start-report delay) and without its output summary."""
        return {
            k: v
            for k, v in self.wait_finished(task_id, timeout).items()
            if k not in ("pid", "started_seconds_ago", "output")
        }

    def texts(self, task_id, stream=None, timeout=30.0):
        """The texts of the task's lines known here, in line order. Once its finish said how many
        lines it wrote, waits (bounded) until the chunks brought every one of them."""
        with self.cond:
            summary = (self.finished.get(task_id) or {}).get("output")
            if summary:
                self.wait_for(
                    lambda: (
                        len(self.logs.get(task_id, {})) >= summary["lines"]
                        and self.all_chunked(task_id, summary["lines"])
                    ),
                    timeout,
                    f"the {summary['lines']} lines of {task_id}",
                )
            lines = self.logs.get(task_id, {})
            return [lines[n][1] for n in sorted(lines) if stream is None or lines[n][0] == stream]

    def all_chunked(self, task_id, count):
        """True when the uploaded chunks hold lines [0, count) (under the lock)."""
        covered = 0
        for first, (meta, _lines) in sorted(self.chunks.get(task_id, {}).items()):
            if first != covered:
                return False
            covered += meta.lines
        return covered >= count

    def chunk_lines(self, task_id):
        """[(line number, at_ms, stream, bytes)] of every line of the uploaded chunks."""
        with self.cond:
            out = []
            for first, (_meta, lines) in sorted(self.chunks.get(task_id, {}).items()):
                out.extend((first + i, *line) for i, line in enumerate(lines))
            return out

    def paths(self, method=None):
        with self.cond:
            return [c[1] for c in self.calls if method is None or c[0] == method]

    # Handling, under the lock unless it waits.

    def handle(self, method, path, query, body, raw_size, raw=b""):
        with self.cond:
            self.calls.append((method, path, body))
            self.cond.notify_all()
        if path.endswith("/finish"):
            for _ in range(600):
                if self.hold_finish.wait(0.1):
                    break
        match = re.match(r"^/api/v1/agent/tasks/(?P<id>[^/]+)/output/(?P<first>\d+)$", path)
        if match and method == "PUT":
            return self._chunk(urllib.parse.unquote(match["id"]), int(match["first"]), query, raw)
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
            try:
                batch = OutputBatch.from_wire(body)
            except ValueError as exc:
                return 400, {"error": {"code": "invalid_request", "message": str(exc)}}
            with self.cond:
                self.batches.setdefault(task_id, []).append(batch)
                self.log_batches.setdefault(task_id, []).append(len(batch.lines))
                known = self.logs.setdefault(task_id, {})
                for line, _at, stream, text in batch.lines:
                    known.setdefault(line, [stream, text])
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

    def _chunk(self, task_id, first_line, query, raw):
        """PUT .../output/{first_line}: a chunk of gzip frames, stored once (idempotent)."""
        for _ in range(600):
            if self.hold_chunks.wait(0.1):
                break
        if self._is_down("output"):
            return 503, {"error": {"code": "unavailable", "message": "down for the test"}}
        if task_id in self.fenced:
            return 409, {"error": {"code": "conflict", "message": "not this node's output"}}
        try:
            meta = ChunkMeta.from_query(first_line, {k: v[0] for k, v in query.items()})
            frames = decompress_chunk(raw, CHUNK_RAW_BYTES + MAX_LINE_BYTES + 64)
            lines = list(iter_lines(frames))
        except ValueError as exc:
            return 400, {"error": {"code": "invalid_request", "message": str(exc)}}
        if len(lines) != meta.lines or len(frames) != meta.bytes:
            return 400, {"error": {"code": "invalid_request", "message": "meta does not match"}}
        with self.cond:
            self.chunks.setdefault(task_id, {})[first_line] = (meta, lines)
            self.chunk_puts.setdefault(task_id, []).append(first_line)
            known = self.logs.setdefault(task_id, {})
            for i, (_at, stream, data) in enumerate(lines):
                known[first_line + i] = [stream, line_text(data)]
            self.cond.notify_all()
        return 204, None

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
        if self.refuse_topology and "topology" in body:
            with self.cond:
                self.refused_heartbeats.append(body)
            fields = {"json": {"topology": ["Unknown field."]}}
            return 400, {
                "error": {
                    "code": "invalid_request",
                    "message": "the request did not validate",
                    "details": {"fields": fields},
                }
            }
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

    def do_PUT(self):  # noqa: N802
        self._handle("PUT")

    def _handle(self, method):
        parsed = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        kind = self.headers.get("Content-Type") or ""
        body = json.loads(raw) if raw and kind.startswith("application/json") else None
        if parsed.path.startswith("/api/v1/agent/") and self.headers.get("X-Fleet-Protocol") != "1":
            status, payload = (
                400,
                {"error": {"code": "protocol_mismatch", "message": "X-Fleet-Protocol: 1"}},
            )
        elif method == "PUT" and kind != "application/gzip":
            status, payload = (
                415,
                {"error": {"code": "unsupported_media_type", "message": "application/gzip"}},
            )
        else:
            status, payload = self.server.fake.handle(
                method, parsed.path, urllib.parse.parse_qs(parsed.query), body, len(raw), raw
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
