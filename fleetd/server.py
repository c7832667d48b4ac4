"""`fleetd serve`: the API on gevent's WSGI server, background tasks, graceful shutdown."""

import datetime as dt
import gc
import json
import logging
import os
import re
import signal
import socket
import sys
import time
import urllib.parse
from collections.abc import Callable

import gevent
import gevent.event
import gevent.pool
import gevent.socket
from apscheduler.schedulers.gevent import GeventScheduler
from gevent.pywsgi import MAX_REQUEST_LINE, Input, LoggingLogAdapter, WSGIHandler, WSGIServer
from werkzeug.exceptions import RequestTimeout

import fleetconf
from fleetd.app import create_app
from fleetd.db import GroupCommit, enable_group_commit, open_database, upgrade
from fleetd.errors import envelope
from fleetd.replicas import SingleProcessLock
from fleetd.services.fleet_ops.replication import replicate
from fleetd.settings import Settings

log = logging.getLogger("fleetd")


ACCESS_LOG = logging.getLogger("fleetd.access")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 5.6.2: what a field name may be
MAX_HEADER_LINE = 65536  # the limits of http.client, which gevent's own parser uses
MAX_HEADERS = 100
SWITCH_INTERVAL_S = 0.0005  # see serve(): how long the event loop may wait for the GIL


class RequestHeaders:
    """A request's header block as gevent's WSGIHandler reads it (`status`, `get`, `getheader`,
    `typeheader`, `headers`, `del`), parsed line by line.

    gevent parses headers with http.client.parse_headers, that is with the email package: about
    a sixth of fleetd's CPU for a small API request. This reads the same block under the same
    limits; a line over 64 KiB, more than 100 headers, a line without a name, with space before
    its colon, or folded leaves `status` set, which gevent answers with 400.
    """

    __slots__ = ("status", "headers", "_fields")

    def __init__(self, fp=None, *_args):
        self.status = ""
        self.headers: list[
            str
        ] = []  # raw "Name: value\r\n" lines, as gevent builds the WSGI environ from them
        self._fields = []  # (lower-case name, value) in order
        if fp is None:
            return
        for _ in range(MAX_HEADERS + 2):
            line = fp.readline(MAX_HEADER_LINE + 1)
            if len(line) > MAX_HEADER_LINE:
                self.status = "Line too long"
                return
            if line in (b"\r\n", b"\n", b""):
                return
            if len(self.headers) >= MAX_HEADERS:
                self.status = f"more than {MAX_HEADERS} headers"
                return
            text = line.decode("iso-8859-1")
            name, sep, value = text.partition(":")
            # No name, a name that is no token (RFC 9110 5.1: space before the colon must be
            # refused, RFC 9112 5.1) or obsolete line folding (5.2: may be refused).
            if not sep or not _TOKEN.fullmatch(name):
                self.status = "Invalid header line"
                return
            self.headers.append(text)
            self._fields.append((name.strip().lower(), value.strip()))
        self.status = f"more than {MAX_HEADERS} headers"

    def get(self, name, default=None):
        name = name.lower()
        for key, value in self._fields:
            if key == name:
                return value
        return default

    getheader = get

    @property
    def typeheader(self):
        return self.get("content-type")

    def __delitem__(self, name):
        name = name.lower()
        self._fields = [(k, v) for k, v in self._fields if k != name]
        self.headers = [
            line for line in self.headers if line.partition(":")[0].strip().lower() != name
        ]


class _BodyWithDeadline(Input):
    """A request's body (wsgi.input) that must arrive by a deadline: the body timeout after the
    headers, plus its length (or, chunked, what arrived so far) at the minimum rate. A client that
    sends a byte every few seconds would otherwise hold a connection and a greenlet for as long as
    it likes. Past the deadline the read raises RequestTimeout (408 in the error envelope) and the
    connection is closed."""

    __slots__ = ("handler", "started")

    def __init__(self, handler, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.handler = handler
        self.started = time.monotonic()

    def _remaining(self):
        server = self.handler.server
        expected = self.content_length if self.content_length is not None else self.position
        return (
            self.started + server.body_timeout + expected / server.body_min_rate - time.monotonic()
        )

    def _within(self, read, *args):
        timer = gevent.Timeout(max(self._remaining(), 0.001))
        timer.start()
        try:
            return read(*args)
        except gevent.Timeout as exc:
            if exc is not timer:
                raise
            # gevent must not wait for the rest before closing. The slot is Input's: gevent is
            # untyped here, so mypy takes this class's own __slots__ for all of them.
            self._chunked_input_error = True  # type: ignore[misc]
            self.handler.close_connection = True
            raise RequestTimeout("the request's body did not arrive in time") from None
        finally:
            timer.close()

    def read(self, length=None):
        return self._within(super().read, length)

    def readline(self, size=None):
        return self._within(super().readline, size)

    def _discard(self):
        try:
            self._within(super()._discard)
        except RequestTimeout:
            pass  # the connection closes instead


class _Handler(WSGIHandler):
    """Tracks connections idle between keep-alive requests, so shutdown need not wait for them."""

    MessageClass = RequestHeaders
    wsgi_input: Input  # gevent's, then a _BodyWithDeadline (get_environ)

    def handle(self):
        # Small JSON replies must not wait for delayed ACKs (Nagle): ~40 ms per request otherwise.
        try:
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # not TCP (a unix socket)
        return super().handle()

    def read_requestline(self):
        """The next request line; None (close) when none comes within the idle timeout."""
        idle = self.server.idle_handlers
        idle.add(self)
        line = None
        try:
            with gevent.Timeout(self.server.idle_timeout, False):
                line = super().read_requestline()
        finally:
            idle.discard(self)
        return line

    def get_environ(self):
        env = super().get_environ()
        if env.get("wsgi.input") is self.wsgi_input:  # not an upgraded connection
            old = self.wsgi_input
            self.wsgi_input = _BodyWithDeadline(
                self,
                old.rfile,
                old.content_length,
                socket=old.socket,
                chunked_input=old.chunked_input,
            )
            env["wsgi.input"] = self.wsgi_input
        return env

    def read_request(self, raw_requestline):
        """Read the headers, which must all arrive within the header timeout (slow clients that
        never finish them would otherwise hold a connection and a greenlet for ever)."""
        self.header_timed_out = False
        try:
            with gevent.Timeout(self.server.header_timeout):
                return super().read_request(raw_requestline)
        except gevent.Timeout:
            self.header_timed_out = True
            raise ValueError("the request's headers did not arrive in time") from None

    def handle_one_request(self):
        if self.server.closed:
            return None  # shutting down: no further requests on this connection
        result = super().handle_one_request()
        if isinstance(
            result, tuple
        ):  # refused before the app: gevent's bare reply, as the envelope
            status = "408" if getattr(self, "header_timed_out", False) else result[0]
            return status, _early_error(int(status))
        return result

    def log_request(self):
        if ACCESS_LOG.isEnabledFor(logging.DEBUG):  # not formatted at all unless it is written
            super().log_request()

    def format_request(self):
        """gevent's access log line, with the value of an ?api_key= (a secret: /graphql takes the
        API token there) replaced."""
        return scrub_secrets(super().format_request())

    def log_error(self, msg, *args):
        """gevent's error line (a malformed request quotes its request line), scrubbed the same
        way."""
        try:
            message = msg % args if args else msg
        except (TypeError, ValueError):
            message = f"{msg!r} {args!r}"
        super().log_error(scrub_secrets(str(message)))


_QUERY_PARAM = re.compile(r"([?&])([^=&\s\"]*)=([^&\s\"]*)")
SECRET_PARAMS = frozenset({"api_key"})
# A share link's token is its path's last segment (GET /api/share/{token}, DELETE
# /api/v1/shares/{token}): whoever reads the log could use it.
_SHARE_PATH = re.compile(r"(/api/(?:v1/shares|share)/)[^?#\s\"]+")


def scrub_secrets(text):
    """`text` (a request line, a URL) with the value of every api_key query parameter redacted,
    however its name is percent-encoded (the app reads it decoded), and a share link's token."""

    def redact(match):
        if urllib.parse.unquote_plus(match.group(2)).lower() in SECRET_PARAMS:
            return f"{match.group(1)}{match.group(2)}=[redacted]"
        return match.group(0)

    return _SHARE_PATH.sub(r"\1[redacted]", _QUERY_PARAM.sub(redact, text))


_EARLY_ERRORS = {
    400: ("Bad Request", "the request line or headers are malformed"),
    408: ("Request Timeout", "the request's headers did not arrive in time"),
    414: ("URI Too Long", f"the request line is longer than {MAX_REQUEST_LINE} bytes"),
    503: ("Service Unavailable", "too many connections from this address; close some and retry"),
}


def _early_error(status):
    """A complete HTTP response carrying the error envelope, for requests refused before the app."""
    reason, message = _EARLY_ERRORS.get(status, _EARLY_ERRORS[400])
    body = json.dumps(
        envelope("unavailable" if status == 503 else "invalid_request", message)
    ).encode()
    retry = "Retry-After: 1\r\n" if status == 503 else ""
    return (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"{retry}Content-Length: {len(body)}\r\n\r\n"
    ).encode("ascii") + body


class _Server(WSGIServer):
    handler_class = _Handler

    def __init__(
        self,
        *args,
        idle_timeout=300.0,
        header_timeout=10.0,
        body_timeout=30.0,
        body_min_rate=102400,
        max_per_address=0,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.idle_handlers = set()
        self.idle_timeout = (
            idle_timeout  # a keep-alive connection may wait this long for its next request
        )
        self.header_timeout = header_timeout  # and then has this long to send all its headers
        self.body_timeout = body_timeout  # and this (plus its length at body_min_rate) for its body
        self.body_min_rate = max(1, body_min_rate)
        self.max_per_address = max_per_address  # 0: no bound
        self.per_address = {}  # client address -> connections open

    def handle(self, sock, address):
        """Serve one connection, unless its address already holds max_per_address: then 503 and
        close."""
        host = address[0] if isinstance(address, tuple) else address
        held = self.per_address.get(host, 0)
        if self.max_per_address and held >= self.max_per_address:
            try:
                sock.sendall(_early_error(503))
            except OSError:
                pass
            finally:
                sock.close()
            return
        self.per_address[host] = held + 1
        try:
            super().handle(sock, address)
        finally:
            left = self.per_address.pop(host, 1) - 1
            if left > 0:
                self.per_address[host] = left

    def shutdown(self, timeout):
        """Stop accepting, close idle connections, give in-flight requests `timeout` seconds."""
        self.close()
        for handler in list(self.idle_handlers):
            try:
                handler.socket.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.stop(timeout=timeout)


def freeze_long_lived():
    """Keep what exists now out of the cyclic collector's full passes (gc.freeze), after collecting
    the young generations. Called after each full read of the inventory and each placement engine
    built afresh, whose objects live long: at 100,000 nodes a full pass of the collector walks
    800,000 GPUs' objects and stops every thread for about half a second. Frozen objects are still
    freed when nothing refers to them any more (reference counting), so an inventory or engine
    that a later one replaces goes."""
    gc.collect(1)
    gc.freeze()


def parse_bind(bind):
    """'HOST:PORT' (IPv6 as [::1]:8080; an empty host listens everywhere) -> (host, port)."""
    return fleetconf.parse_host_port(bind, ValueError, "bind", default_host="0.0.0.0")  # nosec B104  # only when the operator binds an empty host; the default is 127.0.0.1


def serve(settings: Settings, ready_callback: Callable[[str], object] | None = None) -> None:
    """Run until SIGTERM or SIGINT; in-flight requests get shutdown_timeout_seconds to finish."""
    host, port = parse_bind(settings.bind)
    sqlite = settings.database_url.startswith("sqlite:")
    if (
        not sqlite
    ):  # psycopg2 waits for PostgreSQL through gevent: a query blocks its greenlet, not the loop
        import psycogreen.gevent

        psycogreen.gevent.patch_psycopg()
    # synchronous=FULL's guarantee (an acknowledged write is on disk) with one fsync for many
    # commits.
    use_group_commit = sqlite and settings.sqlite_synchronous.upper() == "FULL"
    db = open_database(
        settings.database_url,
        "NORMAL" if use_group_commit else settings.sqlite_synchronous,
        settings.db_pool_size,
        settings.db_statement_timeout_seconds,
        settings.db_pool_wait_seconds,
    )
    lock = (
        SingleProcessLock(db.database).acquire() if sqlite and db.database != ":memory:" else None
    )
    applied = upgrade(db)
    if applied:
        log.info("applied migrations: %s", ", ".join(applied))
    # A pass's decisions are pure CPU work: a worker thread takes them, and the event loop goes
    # on answering heartbeats and submits meanwhile. What start-up builds lives as long as the
    # process: the collector's full passes skip it (freeze_long_lived).
    pool = gevent.get_hub().threadpool
    app = create_app(
        settings,
        db=db,
        offload=lambda fn, *args: pool.apply(fn, args),
        after_full_read=freeze_long_lived,
        pause=gevent.sleep,
    )
    rt = app.extensions["fleetd"]
    # The loop gives up the GIL in every SQLite call and then waits for a busy worker thread to
    # hand it back, up to the switch interval each time (5 ms by default): a heartbeat's few reads
    # took ~20 ms while a pass decided, and requests queued for seconds behind one another.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # What start-up built lives as long as the process: the collector's full passes skip it.
    gc.collect()
    gc.freeze()
    group_commit = None
    if use_group_commit:  # its fsyncs run in gevent's threadpool, not on the event loop
        group_commit = GroupCommit(
            os.path.abspath(db.database) + "-wal", gevent.get_hub().threadpool.apply
        )
        enable_group_commit(group_commit)

    # One greenlet per connection: thousands of agents may wait in long polls at once.
    server = _Server(
        (host, port),
        app,
        spawn=gevent.pool.Pool(settings.max_connections),
        log=LoggingLogAdapter(ACCESS_LOG, logging.DEBUG),
        error_log=LoggingLogAdapter(logging.getLogger("fleetd.http"), logging.ERROR),
        idle_timeout=settings.http_idle_timeout_seconds,
        header_timeout=settings.http_header_timeout_seconds,
        body_timeout=settings.http_body_timeout_seconds,
        body_min_rate=settings.http_body_min_bytes_per_second,
        max_per_address=settings.max_connections_per_address,
    )
    stop = gevent.event.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        gevent.signal_handler(signum, stop.set)
    server.start()
    stop_replication = None
    if not sqlite:
        stop_replication = replicate(rt, db, settings, gevent.spawn, _wait_readable)
    rt.tasks.start(GeventScheduler(timezone=dt.timezone.utc))
    rt.scheduler.start()
    url = f"http://{settings.bind.rpartition(':')[0] or host}:{server.server_port}"
    log.info(
        "fleetd %s listening on %s (database %s); admin UI at %s/ui/",
        _version(),
        url,
        _redact(settings.database_url),
        url,
    )
    if ready_callback:
        ready_callback(url)
    stop.wait()
    log.info(
        "shutting down: no new connections; waiting up to %ss for requests",
        settings.shutdown_timeout_seconds,
    )
    rt.notifier.close()  # long polls answer now instead of holding the shutdown
    server.shutdown(settings.shutdown_timeout_seconds)
    rt.scheduler.stop()
    rt.tasks.shutdown()
    if stop_replication is not None:
        stop_replication()  # hands the lead over at once
    if group_commit is not None:
        log.info("group commit: %d WAL syncs acknowledged the writes", group_commit.done)
    enable_group_commit(None)
    if not db.is_closed():
        db.close()
    if lock is not None:
        lock.release()
    log.info("stopped")


def _wait_readable(fd, timeout):
    """Wait until fd is readable or the timeout passed (gevent: other greenlets run meanwhile)."""
    try:
        gevent.socket.wait_read(fd, timeout)
    except TimeoutError:
        pass


def _version():
    from fleetd import __version__

    return __version__


def _redact(url):
    """The database URL without its password."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        creds, _, host = rest.rpartition("@")
        user = creds.split(":", 1)[0]
        return f"{scheme}{sep}{user}:***@{host}"
    return url
