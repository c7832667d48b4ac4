"""The node-local device/worker API (docs/api.md "Agent local API"), 127.0.0.1:8001 by default.

Success is ``{"data": ...}``, failure the fleetd error envelope. Every route except
/healthz and /readyz needs the bearer token from state_dir/local-api.token; without it /readyz
says only whether the agent is ready (its details, the node id and fleetd's URL among them, need
the token). A non-loopback address is refused unless TLS is configured.
"""

import hmac
import http.server
import json
import logging
import re
import socket
import ssl
import threading

from agent.config import ConfigError, is_loopback

log = logging.getLogger("agent.localapi")

MAX_BODY_BYTES = 64 * 1024
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})


class ApiError(Exception):
    """An error answer: HTTP status, code and message as in fleetd's error envelope (docs/api.md
    "Errors")."""

    def __init__(self, status, code, message, details=None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.details = details


def _not_found(what):
    return ApiError(404, "not_found", f"{what} not found")


class Routes:
    """The API's views over a running Agent (devices, workers, readiness)."""

    def __init__(self, agent):
        self.agent = agent
        self.table = [
            ("GET", re.compile(r"^/healthz$"), self.healthz),
            ("GET", re.compile(r"^/readyz$"), self.readyz),
            ("GET", re.compile(r"^/api/v1/devices$"), self.devices),
            ("POST", re.compile(r"^/api/v1/devices/discover$"), self.discover),
            ("GET", re.compile(r"^/api/v1/devices/(?P<uuid>[^/]+)$"), self.device),
            ("GET", re.compile(r"^/api/v1/workers$"), self.workers),
            ("GET", re.compile(r"^/api/v1/workers/(?P<task_id>[^/]+)$"), self.worker),
            ("GET", re.compile(r"^/api/v1/limiter$"), self.limiter),
            ("GET", re.compile(r"^/api/v1/limiter/node$"), self.limiter_node),
            ("POST", re.compile(r"^/api/v1/trap$"), self.trap),
            ("GET", re.compile(r"^/api/v1/draining$"), self.get_draining),
            ("POST", re.compile(r"^/api/v1/draining$"), self.set_draining),
        ]

    def match(self, method, path):
        """(view, kwargs) for a request; ApiError 404/405 when nothing matches."""
        allowed = False
        for route_method, pattern, view in self.table:
            found = pattern.match(path)
            if found:
                if route_method == method:
                    return view, found.groupdict()
                allowed = True
        if allowed:
            raise ApiError(405, "invalid_request", f"{method} is not allowed on {path}")
        raise _not_found(f"route {path}")

    def healthz(self, body, authorized=False):
        """The process is up."""
        return 200, {"status": "ok"}

    def readyz(self, body, authorized=False):
        """Ready once devices are discovered and fleetd accepted the session; the details (node id,
        fleetd's URL, what is missing) only to a caller with the token."""
        ready, details = self.agent.readiness()
        if not authorized:
            details = None
        if not ready:
            raise ApiError(503, "unavailable", "not ready", details)
        return 200, dict(details or {}, status="ready")

    def _inventory(self):
        inventory = self.agent.devices.inventory
        if inventory is None:
            raise ApiError(503, "unavailable", "devices are being discovered")
        return inventory

    def _device_view(self, device, foreign):
        out = device.to_dict()
        out["foreign_processes"] = [p for p in foreign if p["gpu_uuid"] == device.gpu.uuid]
        return out

    def _foreign(self):
        limits = getattr(self.agent, "limits", None)
        return limits.report()["foreign_processes"] if limits is not None else []

    def devices(self, body):
        """Every GPU with live readings and the GPU processes that belong to no task."""
        foreign = self._foreign()
        return 200, [self._device_view(d, foreign) for d in self._inventory().devices]

    def device(self, body, uuid):
        """One GPU by uuid."""
        device = self._inventory().find(uuid)
        if device is None:
            raise _not_found(f"GPU {uuid}")
        return 200, self._device_view(device, self._foreign())

    def discover(self, body):
        """Re-run discovery (re-initialises NVML) now."""
        inventory = self.agent.devices.discover()
        log.info("discovery requested through the local API: %d GPU(s)", len(inventory.devices))
        return 200, [d.to_dict() for d in inventory.devices]

    def workers(self, body):
        """Running tasks: GPUs, injected env, limits, per-device per-process usage."""
        inventory = self.agent.devices.inventory
        return 200, [w.to_dict(inventory) for w in self.agent.workers.all()]

    def worker(self, body, task_id):
        """One running task."""
        worker = self.agent.workers.get(task_id)
        if worker is None:
            raise _not_found(f"worker {task_id}")
        return 200, worker.to_dict(self.agent.devices.inventory)

    def limiter(self, body):
        """Limits and current usage per worker and GPU."""
        return 200, self.agent.workers.limiter(self.agent.devices.inventory)

    def limiter_node(self, body):
        """The watchdog on this node: polls, foreign GPU processes, cgroups, MPS daemons, recent
        violations."""
        limits = getattr(self.agent, "limits", None)
        if limits is None:
            raise ApiError(503, "unavailable", "the limits watchdog is not running")
        return 200, dict(limits.report(), violations=limits.recent_detections())

    def get_draining(self, body):
        """Whether this host says it is draining (null: it never said), and the node's status as
        fleetd last answered."""
        return 200, {"draining": self.agent.draining, "node_status": self.agent.node_status}

    def set_draining(self, body):
        """{draining: true|false}: the next heartbeats say so, and fleetd cordons the node with the
        reason "agent draining" while it is true (and only that cordon ends when it is false)."""
        if not isinstance(body, dict) or not isinstance(body.get("draining"), bool):
            raise ApiError(400, "invalid_request", "draining (true or false) is required")
        self.agent.draining = body["draining"]
        log.info(
            "the local API says this host is %sdraining", "" if body["draining"] else "no longer "
        )
        return 200, {"draining": self.agent.draining, "node_status": self.agent.node_status}

    def trap(self, body):
        """VRAM pressure on a GPU: the workers to stop, lowest priority first."""
        if not isinstance(body, dict) or not isinstance(body.get("gpu_uuid"), str):
            raise ApiError(400, "invalid_request", "gpu_uuid (string) is required")
        pressure = body.get("pressure_bytes")
        if pressure is not None and (
            not isinstance(pressure, int) or isinstance(pressure, bool) or pressure < 0
        ):
            raise ApiError(400, "invalid_request", "pressure_bytes must be a non-negative integer")
        inventory = self._inventory()
        if inventory.find(body["gpu_uuid"]) is None:
            raise _not_found(f"GPU {body['gpu_uuid']}")
        candidates = self.agent.workers.trap(inventory, body["gpu_uuid"], pressure)
        return 200, {
            "gpu_uuid": body["gpu_uuid"],
            "pressure_bytes": pressure,
            "candidates": candidates,
        }


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "fleet-agent"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that stalls mid-request does not hold a thread for ever
    # The one server that makes these handlers (http.server types it as any BaseServer).
    server: "_Server"

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._handle("GET")

    def do_POST(self):  # noqa: N802
        self._handle("POST")

    def do_PUT(self):  # noqa: N802
        self._handle("PUT")

    def do_DELETE(self):  # noqa: N802
        self._handle("DELETE")

    def _handle(self, method):
        api = self.server.api
        path = self.path.split("?", 1)[0]
        try:
            body = self._read_body()
            authorized = api.authorized(self.headers.get("Authorization", ""))
            if path not in PUBLIC_PATHS and not authorized:
                raise ApiError(
                    401,
                    "unauthorized",
                    "missing or wrong bearer token (see local-api.token in the state dir)",
                )
            view, kwargs = api.routes.match(method, path)
            if path in PUBLIC_PATHS:
                kwargs["authorized"] = authorized  # what a public route tells depends on it
            status, data = view(body, **kwargs)
            self._send(status, {"data": data})
        except ApiError as exc:
            error = {"code": exc.code, "message": str(exc)}
            if exc.details:
                error["details"] = exc.details
            self._send(exc.status, {"error": error})

    def _read_body(self):
        length = self.headers.get("Content-Length")
        if not length:
            return None
        if not length.isdigit():
            raise ApiError(400, "invalid_request", "bad Content-Length")
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            raise ApiError(413, "payload_too_large", f"body over {MAX_BODY_BYTES} bytes")
        raw = self.rfile.read(int(length))
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "invalid_request", "body is not JSON") from None

    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="fleet-agent"')
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt, *args):
        log.debug("%s %s", self.address_string(), fmt % args)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, family, api):
        self.address_family = family
        self.api = api
        super().__init__(address, _Handler)

    def finish_request(self, request, client_address):
        # TLS handshakes happen here, in the request's thread, not in the accept loop.
        if isinstance(request, ssl.SSLSocket):
            try:
                request.settimeout(_Handler.timeout)
                request.do_handshake()
            except (OSError, ssl.SSLError) as exc:
                log.info("TLS handshake with %s failed: %s", client_address[0], exc)
                return
        super().finish_request(request, client_address)


class LocalApi:
    """The HTTP server in a background thread."""

    def __init__(self, agent, config, token):
        self.routes = Routes(agent)
        self.config = config
        self._token = token.encode()
        self._server = None
        self._thread = None
        self.url = None

    def authorized(self, header):
        """Constant-time check of `Authorization: Bearer <token>`."""
        scheme, _, value = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            value.strip().encode(), self._token
        )

    def start(self):
        """Bind and serve; ConfigError for a non-loopback bind without TLS."""
        host, port = self.config.local_api_host_port
        tls = bool(self.config.local_api_tls_cert and self.config.local_api_tls_key)
        if not is_loopback(host) and not tls:
            raise ConfigError(
                f"refusing to serve the local API on non-loopback {host}:{port} without TLS "
                "(set local_api.tls_cert and local_api.tls_key)"
            )
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._server = _Server((host, port), family, self)
        scheme = "http"
        if tls:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(self.config.local_api_tls_cert, self.config.local_api_tls_key)
            self._server.socket = context.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
            scheme = "https"
        bound_port = self._server.server_address[1]
        self.url = f"{scheme}://{'[' + host + ']' if ':' in host else host}:{bound_port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.25},
            name="local-api",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self):
        """Stop serving and close the socket."""
        if self._server is not None:
            if (
                self._thread is not None
            ):  # serving (a start that failed at TLS never served: shutdown would wait)
                self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._server = None
