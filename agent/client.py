"""The agent's side of the agent protocol (docs/api.md "Agent protocol", X-Fleet-Protocol: 1).

Plain urllib3 (what requests is built on): every task costs the agent calls to fleetd
(acquire, start, finish), and urllib3 spends half the CPU requests does on each.

fleetd may run as several replicas, each answering every route: `ServerUrls` holds their URLs
and the one in use, shared by all the clients of an agent. Every call goes to the URL in use; a
connection error, a timeout or a 5xx moves it to the next URL and the call goes on there, each
URL tried at most once per call. Only when every URL failed does the call raise Unreachable, so
the callers' back-off applies once per round of URLs, never per URL. Any other answer (2xx,
4xx, 429) is fleetd's answer and moves nothing.
"""

import hashlib
import json
import logging
import os
import random
import re
import threading
import urllib.parse

import urllib3

from fleetwire.finish import FinishResult, TaskFinish
from fleetwire.heartbeat import HeartbeatReply
from fleetwire.registration import Registered
from fleetwire.tasks import (
    Acquire,
    AcquireReply,
    Rendezvous,
    RendezvousPublish,
    TaskRestarting,
    TaskStarted,
)

log = logging.getLogger("agent.client")

PROTOCOL_HEADER = "X-Fleet-Protocol"
PROTOCOL_VERSION = "1"


class FleetdError(Exception):
    """fleetd answered with an error (or not at all)."""

    def __init__(self, message, status=None, code=None, retry_after=None, details=None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after
        self.details = details or {}


class Unreachable(FleetdError):
    """Worth retrying: no connection, a timeout, 429, or a 5xx."""


class Rejected(FleetdError):
    """Not worth retrying with the same credentials: 401 (revoked, replaced or unknown session)."""


class Conflict(FleetdError):
    """409: a stale epoch; fleetd no longer leases this task to this node (fencing)."""


class TooLarge(FleetdError):
    """413: the body is over fleetd's size limit."""


class DigestMismatch(FleetdError):
    """A downloaded artifact's bytes do not hash to the sha256 it was asked for."""


DOWNLOAD_CHUNK_BYTES = 1 << 20


def backoff_delay(attempt, cap, rng=random, base=1.0):
    """Exponential backoff with jitter: half fixed, half random, never above `cap`."""
    ceiling = min(cap, base * 2 ** min(attempt, 32))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def display_url(url):
    """`url` without any user:password part, for logs and status."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


class ServerUrls:
    """fleetd's URLs (replicas of one control plane) and the index of the one in use.

    One instance is shared by every FleetClient of an agent (heartbeat, acquire, task threads,
    log shipping), so a switch made after one thread's failed call moves them all. Thread-safe:
    a failure moves the index only if it still points at the URL that failed, so threads that
    saw the same URL fail at the same time switch once, not once each.
    """

    def __init__(self, urls):
        if isinstance(urls, str):
            urls = [urls]
        self.urls = tuple(url.rstrip("/") for url in urls)
        if not self.urls:
            raise ValueError("no fleetd URL")
        self._index = 0
        self._lock = threading.Lock()

    def __len__(self):
        return len(self.urls)

    @property
    def index(self):
        """Index of the URL in use."""
        with self._lock:
            return self._index

    @property
    def current(self):
        """The URL in use."""
        with self._lock:
            return self.urls[self._index]

    def next_to_try(self, tried):
        """Index of the URL a call tries next: the one in use unless this call tried it already,
        else the first untried one after it; None once the call tried them all."""
        with self._lock:
            start = self._index
        for step in range(len(self.urls)):
            index = (start + step) % len(self.urls)
            if index not in tried:
                return index
        return None

    def failed(self, index, reason=""):
        """The call to urls[index] failed (no connection, a timeout, a 5xx): the next call goes to
        the next URL. A no-op when the URL in use has moved on already, or there is only one."""
        with self._lock:
            if len(self.urls) == 1 or index != self._index:
                return
            self._index = (index + 1) % len(self.urls)
            new = self.urls[self._index]
        log.warning(
            "fleetd at %s failed (%s); switching to %s (%d of %d)",
            display_url(self.urls[index]),
            reason or "no answer",
            display_url(new),
            self.urls.index(new) + 1,
            len(self.urls),
        )


class FleetClient:
    """Calls to fleetd's /api/v1/agent routes.

    `server_url`: one URL, a list of them, or a ServerUrls shared with other clients. The session
    and TLS settings (CA bundle or pin) apply to every URL.
    """

    def __init__(self, server_url, session_token=None, ca_file="", tls_pin="", timeout=10.0):
        self.urls = server_url if isinstance(server_url, ServerUrls) else ServerUrls(server_url)
        self.session_token = session_token
        self.timeout = timeout
        tls = {}
        if tls_pin:
            # The pin replaces CA validation (self-signed fleetd); urllib3 checks the fingerprint.
            tls = {"cert_reqs": "CERT_NONE", "assert_fingerprint": tls_pin.replace(":", "").lower()}
        elif ca_file:
            tls = {"cert_reqs": "CERT_REQUIRED", "ca_certs": ca_file}
        # No proxy from the environment: node credentials never go through one. No retries here but
        # the failover to another URL: the callers decide (backoff, fencing); one connection per
        # client and URL, kept alive.
        self.http = urllib3.PoolManager(
            num_pools=max(2, len(self.urls)), maxsize=1, retries=False, **tls
        )

    @property
    def base(self):
        """The fleetd URL in use."""
        return self.urls.current

    def close(self):
        """Close pooled connections."""
        self.http.clear()

    def register(self, join_token, registration):
        """POST a Registration (fleetwire.registration) with a join token -> fleetd's Registered."""
        data = self._post("/api/v1/agent/register", registration.to_wire(), join_token)
        try:
            return Registered.from_wire(data)
        except ValueError as exc:
            raise FleetdError(f"fleetd's answer to a registration is not one: {exc}") from exc

    def heartbeat(self, beat):
        """POST a Heartbeat (fleetwire.heartbeat) -> fleetd's HeartbeatReply. An answer that is not
        one is a FleetdError, as a refused heartbeat is."""
        data = self._post("/api/v1/agent/heartbeat", beat.to_wire(), self.session_token)
        try:
            return HeartbeatReply.from_wire(data)
        except ValueError as exc:
            raise FleetdError(f"fleetd's answer to a heartbeat is not one: {exc}") from exc

    def report_validation(self, validation_id, report):
        """POST the results of a validation fleetd gave this node (a fleetwire ValidationReport)."""
        self._post(
            f"/api/v1/agent/validations/{urllib.parse.quote(validation_id, safe='')}",
            report.to_wire(),
            self.session_token,
        )

    def deregister(self):
        """POST /agent/deregister: leave the fleet."""
        self._post("/api/v1/agent/deregister", {}, self.session_token)

    def acquire(self, wait_seconds=30, max_assignments=None):
        """POST /agent/acquire, a long poll -> the Assignments delivered ([] when none came in
        time); with `max_assignments`, up to that many at once."""
        return self.acquire_work(wait_seconds, max_assignments)[0]

    def acquire_work(self, wait_seconds=30, max_assignments=None):
        """POST /agent/acquire, a long poll -> (Assignments delivered, ids of tasks to stop now, ids
        of tasks whose output a reader waits for); all empty when nothing came in time. A fleetd
        that predates `cancel` never sends stops here (the heartbeat's `cancel` carries them)."""
        reply = self._post(
            "/api/v1/agent/acquire",
            Acquire(wait_seconds, max_assignments).to_wire(),
            self.session_token,
            timeout=wait_seconds + self.timeout,
        )
        try:
            work = AcquireReply.from_wire(reply)
        except ValueError as exc:
            raise FleetdError(f"fleetd's answer to an acquire is not one: {exc}") from exc
        return list(work.assignments), list(work.cancel), list(work.flush_output)

    def task_start(self, task_id, epoch, pid=None, extra=None, started_seconds_ago=None):
        """POST /agent/tasks/{id}/start: the task's process runs (`extra`: an instance's
        `ports`), since `started_seconds_ago` (by this host's monotonic clock)."""
        extra = extra or {}
        started = TaskStarted(
            epoch=epoch,
            pid=pid,
            restarts=extra.get("restarts") or 0,
            ports=None if extra.get("ports") is None else tuple(extra["ports"]),
            started_seconds_ago=started_seconds_ago,
        )
        self._post(_task_path(task_id, "start"), started.to_wire(), self.session_token)

    def task_restart(self, task_id, epoch, exit_code, signal, reason, backoff_seconds):
        """POST /agent/tasks/{id}/restart: an instance run's process ended and starts again after
        the back-off."""
        report = TaskRestarting(
            epoch=epoch,
            backoff_seconds=backoff_seconds,
            exit_code=exit_code,
            signal=signal,
            reason=reason or "",
        )
        self._post(_task_path(task_id, "restart"), report.to_wire(), self.session_token)

    def publish_rendezvous(self, task_id, epoch, addr, port):
        """POST /agent/tasks/{id}/rendezvous (rank 0): where the other ranks find it."""
        self._post(
            _task_path(task_id, "rendezvous"),
            RendezvousPublish(epoch, addr, port).to_wire(),
            self.session_token,
        )

    def wait_rendezvous(self, task_id, wait_seconds=30):
        """GET /agent/tasks/{id}/rendezvous, a long poll -> (addr, port), or None when not published
        in time."""
        try:
            reply = self._request(
                "GET",
                _task_path(task_id, "rendezvous"),
                self.session_token,
                params={"wait_seconds": wait_seconds},
                timeout=wait_seconds + self.timeout,
                answers=(504,),
            )  # 504: not published in time, fleetd's answer
        except Unreachable as exc:
            if exc.status == 504:
                return None
            raise
        try:
            point = Rendezvous.from_wire(reply)
        except ValueError as exc:
            raise FleetdError(f"fleetd's rendezvous is not one: {exc}") from exc
        return point.addr, point.port

    def task_output_batch(self, task_id, batch):
        """POST /agent/tasks/{id}/logs with an OutputBatch (fleetwire.output): the next lines of
        the task's output; TooLarge (413) over fleetd's limit, Conflict (409) when this node may
        no longer write this output."""
        self._post(_task_path(task_id, "logs"), batch.to_wire(), self.session_token)

    def put_output_chunk(self, task_id, meta, blob):
        """PUT /agent/tasks/{id}/output/{first_line}?<ChunkMeta> with a chunk's gzip bytes; fleetd
        answers 204 once it stored it (again: idempotent)."""
        path = _task_path(task_id, f"output/{int(meta.first_line)}")
        self._request(
            "PUT",
            path,
            self.session_token,
            params=meta.to_query(),
            body=bytes(blob),
            content_type="application/gzip",
        )

    def task_finish_body(self, task_id, body):
        """POST /agent/tasks/{id}/finish with a TaskFinish (finish_body())."""
        self._post(_task_path(task_id, "finish"), body.to_wire(), self.session_token)

    def task_finishes(self, reports):
        """POST /agent/finish: several finish reports at once, [(task_id, TaskFinish), ...].

        Returns one entry per report, in order: None when fleetd settled it, else the error a
        single finish would have raised (Conflict for a stale epoch). Errors of the call itself
        raise as for any call; an older fleetd without the route answers 404 or 405.
        """
        finishes = [dict(body.to_wire(), task_id=task_id) for task_id, body in reports]
        reply = self._post("/api/v1/agent/finish", {"finishes": finishes}, self.session_token) or {}
        results = reply.get("results")
        try:
            parsed = (
                [FinishResult.from_wire(result) for result in results]
                if isinstance(results, list)
                else None
            )
        except ValueError:
            parsed = None
        if parsed is None or [r.task_id for r in parsed] != [task_id for task_id, _ in reports]:
            raise Unreachable(
                f"fleetd answered {len(reports)} finish reports with a reply that does not match "
                f"them"
            )
        out: list[FleetdError | None] = []
        for result in parsed:
            if result.status == 204:
                out.append(None)
                continue
            error = result.error or {}
            details = error.get("details")
            out.append(
                error_for(
                    result.status,
                    error.get("code", ""),
                    error.get("message", ""),
                    details if isinstance(details, dict) else {},
                )
            )
        return out

    def download_artifact(self, sha256, dest):
        """GET /artifacts/{sha256} streamed into the file `dest`; DigestMismatch unless the bytes
        hash to sha256.

        The file is written next to `dest` and renamed into place only once verified.
        """
        path = "/api/v1/artifacts/" + urllib.parse.quote(sha256, safe="")
        tmp = f"{dest}.part"
        digest = hashlib.sha256()
        size = 0
        resp = self._send("GET", path, self._headers(self.session_token), stream=True)
        try:
            if resp.status != 200:
                _raise_for(resp)  # reads (and keeps) the error body
            try:
                with open(tmp, "wb") as fh:
                    for chunk in resp.stream(DOWNLOAD_CHUNK_BYTES):
                        digest.update(chunk)
                        size += len(chunk)
                        fh.write(chunk)
            except urllib3.exceptions.HTTPError as exc:
                _unlink(tmp)
                raise Unreachable(f"artifact download interrupted: {_short(exc)}") from None
            except BaseException:
                _unlink(tmp)
                raise
        finally:
            resp.release_conn()
        if digest.hexdigest() != sha256:
            _unlink(tmp)
            raise DigestMismatch(
                f"artifact {sha256} failed verification: its {size} bytes hash to "
                f"{digest.hexdigest()}"
            )
        os.replace(tmp, dest)
        return size

    def _post(self, path, body, token, timeout=None):
        return self._request(
            "POST",
            path,
            token,
            body=json.dumps(body).encode(),
            timeout=timeout,
            content_type="application/json",
        )

    @staticmethod
    def _headers(token, content_type=None):
        headers = {PROTOCOL_HEADER: PROTOCOL_VERSION, "Authorization": f"Bearer {token}"}
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _request(
        self,
        method,
        path,
        token,
        timeout=None,
        params=None,
        body=None,
        content_type=None,
        answers=(),
    ):
        if params:
            path += "?" + urllib.parse.urlencode(params)
        resp = self._send(
            method,
            path,
            self._headers(token, content_type),
            body=body,
            timeout=timeout,
            answers=answers,
        )
        if resp.status in (200, 201):
            try:
                return json.loads(resp.data)
            except ValueError:
                raise Unreachable(
                    f"fleetd answered {resp.status} with a body that is not JSON", resp.status
                ) from None
        if resp.status == 204:
            return None
        _raise_for(resp)

    def _send(self, method, path, headers, body=None, timeout=None, stream=False, answers=()):
        """One call, failed over: the URL in use first, then each other URL at most once. A
        connection error, a timeout or a 5xx (but `answers`) moves on to the next URL; the response
        otherwise. Unreachable (the last URL's error) when every URL failed."""
        timeout = timeout or self.timeout
        # Connecting is quick or it fails: a long poll's wait is no reason to wait longer for a dead
        # host.
        limits = urllib3.Timeout(connect=min(self.timeout, timeout), read=timeout)
        tried: set[int] = set()
        error: FleetdError | None = None
        while True:
            index = self.urls.next_to_try(tried)
            if index is None:
                # ServerUrls is never empty: the first URL is always tried, and every try that fails
                # sets error.
                assert error is not None
                if len(tried) > 1:
                    error.args = (
                        f"{error.args[0]} (every one of the {len(tried)} fleetd URLs failed)",
                    )
                raise error
            tried.add(index)
            try:
                resp = self.http.request(
                    method,
                    self.urls.urls[index] + path,
                    body=body,
                    timeout=limits,
                    headers=headers,
                    preload_content=not stream,
                )
            except urllib3.exceptions.SSLError as exc:
                error = Unreachable(f"TLS error talking to fleetd: {_short(exc)}")
            except urllib3.exceptions.HTTPError as exc:
                error = Unreachable(f"fleetd unreachable: {_short(exc)}")
            else:
                if resp.status < 500 or resp.status in answers:
                    return resp
                try:
                    error = _error_of(resp)  # reads the error body
                finally:
                    resp.release_conn()
            self.urls.failed(index, str(error))


def finish_body(
    epoch, outcome, exit_code=None, reason=None, lost=False, pid=None, started_seconds_ago=None
):
    """A finish report (fleetwire.finish.TaskFinish): succeeded, failed or cancelled (`lost`: the
    agent ended it; `pid`: the start was not reported, this reports it too, with
    `started_seconds_ago`)."""
    return TaskFinish(
        epoch=epoch,
        outcome=outcome,
        exit_code=exit_code,
        reason=reason or "",
        lost=lost,
        pid=pid,
        started_seconds_ago=started_seconds_ago if pid is not None else None,
    )


def _task_path(task_id, action):
    return f"/api/v1/agent/tasks/{urllib.parse.quote(str(task_id), safe='')}/{action}"


def error_for(status, code, message, details=None, retry_after=None):
    """The FleetdError for an error answer: Rejected (401), Conflict (409), TooLarge (413),
    Unreachable (429 and 5xx: worth retrying) or FleetdError."""
    text = f"fleetd answered {status} {code}: {message}"
    if status == 401:
        return Rejected(message, status, code)
    if status == 409:
        return Conflict(text, status, code, details=details)
    if status == 413:
        return TooLarge(text, status, code)
    if not isinstance(status, int) or status == 429 or status >= 500:
        return Unreachable(text, status, code, retry_after)
    return FleetdError(text, status, code, details=details)


def _error_of(resp):
    code, message = _error(resp)
    retry_after = resp.headers.get("Retry-After")
    return error_for(
        resp.status,
        code,
        message,
        _details(resp) if resp.status in (400, 409) else None,  # 400: the fields refused
        float(retry_after) if retry_after and retry_after.isdigit() else None,
    )


def _raise_for(resp):
    raise _error_of(resp)


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _error(resp):
    try:
        err = json.loads(resp.data)["error"]
        return err.get("code", ""), err.get("message", "")
    except (ValueError, KeyError, TypeError):
        return "", resp.data[:200].decode("utf-8", "replace")


def _details(resp):
    try:
        details = json.loads(resp.data)["error"].get("details")
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
    return details if isinstance(details, dict) else {}


def _short(exc):
    # urllib3 nests the reason inside; the innermost text is the useful part.
    reason = exc
    while getattr(reason, "args", None) and isinstance(reason.args[0], BaseException):
        reason = reason.args[0]
    text = str(getattr(reason, "reason", None) or reason)
    return re.sub(r"^<[^>]*>: ", "", text)[:300]  # urllib3 prefixes the connection object's repr
