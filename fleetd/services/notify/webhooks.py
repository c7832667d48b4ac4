"""Webhooks: receivers of event notifications, an outbox of deliveries written in the transaction of
the event that causes them, and the sender (the `webhooks` background task) that signs, posts and
retries them with back-off."""

import base64
import concurrent.futures
import datetime as dt
import hashlib
import hmac
import json
import logging
import os
import time
import urllib.parse

import certifi
import urllib3

from fleetd.clock import isoformat
from fleetd.db import write_transaction
from fleetd.errors import InvalidRequest, NotFound
from fleetd.models import Webhook, WebhookDelivery, new_id
from fleetd.services.notify import webhook_targets
from fleetd.services.pagination import last_rows, paginate

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Fleetd-Signature"
NOT_SENT = (None, None)  # an attempt this replica did not make (it stopped leading): not counted

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
MAX_ATTEMPTS = 8  # then the delivery is given up (state failed, its last error kept)
BACKOFF_SECONDS = (5, 15, 60, 300, 900, 1800, 3600)  # before attempt 2, 3, ...
BATCH = 100  # deliveries one sender run takes at most
CONCURRENCY = 8  # requests in flight at once
CONNECT_TIMEOUT, READ_TIMEOUT = 5.0, 10.0
CLAIM = dt.timedelta(
    minutes=5
)  # a delivery being sent is not due again before this (see _claim_due)
KEEP_FINISHED = dt.timedelta(days=7)  # delivered or given-up deliveries are listed this long
ERROR_MAX = 500


def _node_kind(from_status, to_status):
    if to_status == "lost":
        return "node.lost"
    if from_status == "lost" and to_status not in (None, "revoked"):
        return "node.returned"
    if to_status == "drained":
        return "node.drained"
    if to_status == "revoked":
        return "node.revoked"
    if from_status == "revoked" and to_status == "pending":
        return "node.enrolled"  # enrolled again with a new join token
    return None


# Which stored events notify, by event kind: fn(from_status, to_status) -> webhook kind or None.
_NOTIFYING = {
    "node.status": _node_kind,
    "node.health": lambda _f, _t: "node.health",
    "job.state": lambda _f, to: "job.failed" if to == "failed" else None,
    "instance.state": lambda _f, to: "instance.interrupted" if to == "interrupted" else None,
    "leader.changed": lambda _f, _t: "leader.changed",
    "node.validation": lambda _f, _t: "node.validation",
    "budget.threshold": lambda _f, _t: "budget.threshold",
    "node.registered": lambda f, _t: "node.enrolled" if f is None else None,
    "node.deleted": lambda _f, _t: "node.deleted",
    "node.upgraded": lambda _f, _t: "node.upgraded",
    "node.labels": lambda _f, _t: "node.labels",
    "node.bootstrap": lambda _f, _t: "node.bootstrap",
    "gpu.rma": lambda _f, _t: "gpu.rma",
    "gpu.flagged": lambda _f, _t: "gpu.flagged",
    "gpu.rma_cleared": lambda _f, _t: "gpu.rma_cleared",
    "gpu.mig_changed": lambda _f, _t: "gpu.mig_changed",
    "gpu.mig_failed": lambda _f, _t: "gpu.mig_failed",
    "rollout.node": lambda _f, to: "rollout.node" if to in ("done", "failed") else None,
    "rollout.state": lambda _f, to: (
        "rollout.state" if to in ("paused", "done", "failed", "aborted") else None
    ),
}


def webhook_kind(kind, from_status, to_status):
    """The webhook kind an Event of `kind` notifies, or None (most events notify nobody)."""
    decide = _NOTIFYING.get(kind)
    return decide(from_status, to_status) if decide is not None else None


def enqueue(now, kind, subject, data):
    """Queue a delivery of this notification to every webhook that receives `kind` (inside the
    transaction of the event: the delivery exists exactly when the event does). `data`: what it
    carries, or a function that makes it, called only when some webhook receives `kind`."""
    hooks = [h.id for h in Webhook.select(Webhook.id, Webhook.events) if kind in (h.events or ())]
    if hooks and callable(data):
        data = data()
    rows = []
    for hook_id in hooks:
        delivery_id = new_id()
        body = json.dumps(
            {
                "id": delivery_id,
                "kind": kind,
                "at": isoformat(now),
                "subject": subject,
                "data": data,
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        rows.append(
            {
                "id": delivery_id,
                "webhook": hook_id,
                "kind": kind,
                "at": now,
                "body": body,
                "state": PENDING,
                "attempts": 0,
                "next_attempt_at": now,
                "error": "",
            }
        )
    if rows:
        WebhookDelivery.insert_many(rows).execute()
    return len(rows)


def sign(secret, body):
    """The signature header's value: sha256=<hex HMAC-SHA256 of the body with the secret>."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


STANDARD_PREFIX = "whsec_"  # a Standard Webhooks secret: this, then the base64 of the key's bytes
MIN_STANDARD_KEY_BYTES = 16


def _decoded_key(secret):
    """The key of a `whsec_` secret (its base64, padded or not, decoded); ValueError when it is no
    base64."""
    text = secret.removeprefix(STANDARD_PREFIX)
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def standard_key_problem(secret):
    """Why a secret in the Standard Webhooks form (`whsec_` + base64) cannot be used, or None (also
    for a plain secret, whose key is its UTF-8 bytes)."""
    if not secret.startswith(STANDARD_PREFIX):
        return None
    try:
        key = _decoded_key(secret)
    except ValueError:
        return (
            f"a secret that starts with {STANDARD_PREFIX} is a Standard Webhooks secret: "
            f"{STANDARD_PREFIX} "
            "and the base64 of the key (give a plain secret without that prefix)"
        )
    if len(key) < MIN_STANDARD_KEY_BYTES:
        return (
            f"a Standard Webhooks secret ({STANDARD_PREFIX} and base64) holds a key of at least "
            f"{MIN_STANDARD_KEY_BYTES} bytes"
        )
    return None


def standard_key(secret):
    """The HMAC key of the Standard Webhooks signature, read from the secret as the specification
    says: after `whsec_`, the base64 of the key's bytes (what receivers' libraries generate and
    verify with); a plain secret's key is its UTF-8 bytes (such a receiver names it `whsec_` +
    base64(secret))."""
    if secret.startswith(STANDARD_PREFIX) and standard_key_problem(secret) is None:
        return _decoded_key(secret)
    return secret.encode(
        "utf-8"
    )  # plain, or stored before create refused a malformed whsec_ secret


def standard_headers(secret, delivery_id, timestamp, body):
    """The Standard Webhooks headers: `webhook-id` (the delivery's id, the same on every retry),
    `webhook-timestamp` (this attempt, in Unix seconds) and `webhook-signature` (`v1,` and the
    base64 HMAC-SHA256 of `id.timestamp.body` with the key `standard_key` reads from the secret)."""
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    digest = hmac.new(standard_key(secret), signed, hashlib.sha256).digest()
    return {
        "webhook-id": delivery_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + base64.b64encode(digest).decode("ascii"),
    }


# ---------------------------------------------------------------- admin: the webhooks themselves


def create_webhook(rt, principal, url, secret, events):
    """Store a webhook; the secret is kept to sign deliveries and never shown again. A URL whose
    host is, or resolves to, an address webhooks may not post to is refused (resolved before the
    transaction: no network call inside it). A secret in the Standard Webhooks form must decode."""
    try:
        webhook_targets.check_url(url, rt.settings.webhook_allowed_networks)
    except webhook_targets.TargetRefused as exc:
        raise InvalidRequest(
            f"webhook url refused: {exc}", {"fields": {"json": {"url": [str(exc)]}}}
        ) from None
    problem = standard_key_problem(secret)
    if problem:
        raise InvalidRequest(
            f"webhook secret refused: {problem}", {"fields": {"json": {"secret": [problem]}}}
        )
    now = rt.clock.now()
    with write_transaction():
        return Webhook.create(
            id=new_id(),
            url=url,
            secret=secret,
            events=sorted(set(events)),
            created_at=now,
            created_by=principal.label if principal is not None else "",
        )


def list_webhooks(limit, cursor=None):
    return paginate(
        Webhook.select(
            Webhook.id, Webhook.url, Webhook.events, Webhook.created_at, Webhook.created_by
        ),
        Webhook.id,
        limit,
        cursor,
    )


def delete_webhook(webhook_id):
    """Forget a webhook and its deliveries (those still pending are not sent)."""
    with write_transaction():
        if Webhook.get_or_none_by_id(webhook_id) is None:
            raise NotFound(f"webhook {webhook_id} not found")
        WebhookDelivery.delete().where(WebhookDelivery.webhook == webhook_id).execute()
        Webhook.delete().where(Webhook.id == webhook_id).execute()


def get_webhook(webhook_id):
    """A webhook without its secret; NotFound if there is none."""
    hook = (
        Webhook.select(
            Webhook.id, Webhook.url, Webhook.events, Webhook.created_at, Webhook.created_by
        )
        .where(Webhook.id == webhook_id)
        .first()
    )
    if hook is None:
        raise NotFound(f"webhook {webhook_id} not found")
    return hook


def _deliveries(webhook_id):
    get_webhook(webhook_id)
    return WebhookDelivery.select(
        WebhookDelivery.id,
        WebhookDelivery.kind,
        WebhookDelivery.at,
        WebhookDelivery.state,
        WebhookDelivery.attempts,
        WebhookDelivery.status_code,
        WebhookDelivery.error,
        WebhookDelivery.next_attempt_at,
        WebhookDelivery.finished_at,
    ).where(WebhookDelivery.webhook == webhook_id)


def list_deliveries(webhook_id, limit, cursor=None):
    """A webhook's deliveries, oldest first."""
    return paginate(_deliveries(webhook_id), WebhookDelivery.id, limit, cursor)


def deliveries_tail(webhook_id, count):
    """A webhook's last `count` deliveries, oldest first."""
    return last_rows(_deliveries(webhook_id), WebhookDelivery.id, count)


# ---------------------------------------------------------------- the sender


def _post(url, secret, body, delivery_id, kind, allowed, may_send):
    """One attempt: (status_code or None, error or ""), or NOT_SENT when `may_send()` says no right
    before the request. Resolves the host once, refuses it if any of its addresses is not allowed,
    and connects to those checked addresses only (TLS verifies the certificate against the host
    name). Never follows a redirect (a 3xx is a failure: the receiver must name its final URL);
    reads no response body."""
    raw = body.encode("utf-8")
    try:
        host, port, addresses = webhook_targets.pin(url, allowed)
    except webhook_targets.TargetRefused as exc:
        return None, f"refused: {exc}"
    except OSError:
        return None, "the host name does not resolve"
    parts = urllib.parse.urlsplit(url)
    target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    headers = {
        "Host": parts.netloc,
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign(secret, raw),
        "X-Fleetd-Delivery": delivery_id,
        "X-Fleetd-Event": kind,
        "User-Agent": "fleetd-webhooks",
    }
    # The receiver's clock judges this timestamp: it is the wall clock's, not fleetd's injected one.
    headers.update(standard_headers(secret, delivery_id, int(time.time()), raw))
    error = "the host name resolves to no address"
    for address in addresses:  # bounded: pin() returns at most MAX_ADDRESSES
        if not may_send():
            return NOT_SENT
        pool = _pool(parts.scheme, host, port, str(address))
        try:
            resp = pool.urlopen(
                "POST",
                target,
                body=raw,
                headers=headers,
                redirect=False,
                retries=False,
                preload_content=False,
                assert_same_host=False,
            )
            code = resp.status
            resp.release_conn()
        except (
            urllib3.exceptions.NewConnectionError
        ) as exc:  # refused or unreachable: try the next address
            error = _describe(exc)
            continue
        except (urllib3.exceptions.HTTPError, OSError, ValueError, UnicodeError) as exc:
            return None, _describe(exc)
        finally:
            pool.close()
        if 200 <= code < 300:
            return code, ""
        if 300 <= code < 400:
            return code, f"HTTP {code}: redirects are not followed"
        return code, f"HTTP {code}"
    return None, error


def _pool(scheme, host, port, address):
    """A one-connection pool to `address` (already checked) that speaks to it as `host`."""
    timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT, read=READ_TIMEOUT)
    if scheme == "https":
        return urllib3.HTTPSConnectionPool(
            address,
            port,
            maxsize=1,
            timeout=timeout,
            retries=False,
            cert_reqs="CERT_REQUIRED",
            ca_certs=_ca_bundle(),
            server_hostname=host,
            assert_hostname=host,
        )
    return urllib3.HTTPConnectionPool(address, port, maxsize=1, timeout=timeout, retries=False)


def _ca_bundle():
    """The certificates a receiver's must chain to: those REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE names
    (a private CA for receivers on the lab's network), else certifi's, as the requests library
    chose."""
    return (
        os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or certifi.where()
    )


def _describe(exc):
    """A request error in a few words, without the URL (it may carry a token in its query)."""
    kind = type(exc).__name__
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        return f"{kind}: could not connect"
    if isinstance(
        exc, (urllib3.exceptions.ConnectTimeoutError, urllib3.exceptions.ReadTimeoutError)
    ):
        return f"{kind}: no answer within {CONNECT_TIMEOUT:g}s (connect) / {READ_TIMEOUT:g}s (read)"
    if isinstance(exc, urllib3.exceptions.SSLError):
        return f"{kind}: the TLS handshake or the certificate's verification failed"
    return kind


def _backoff(attempts):
    return dt.timedelta(seconds=BACKOFF_SECONDS[min(attempts - 1, len(BACKOFF_SECONDS) - 1)])


def _claim_due(now, leader):
    """The deliveries due now (at most BATCH), taken under the leader's fence: a replica that was
    deposed (even one paused past its lease that still believes it leads) gets Fenced here and sends
    nothing. Each taken delivery is put off by CLAIM, so that a leader that dies while sending
    leaves it to the next one after that, and another leader does not send it meanwhile."""
    with write_transaction():
        leader.fence()
        due = list(
            WebhookDelivery.select(
                WebhookDelivery.id,
                WebhookDelivery.kind,
                WebhookDelivery.body,
                WebhookDelivery.attempts,
                Webhook.url,
                Webhook.secret,
            )
            .join(Webhook, on=(WebhookDelivery.webhook == Webhook.id))
            .where((WebhookDelivery.state == PENDING) & (WebhookDelivery.next_attempt_at <= now))
            .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
            .limit(BATCH)
            .objects()
        )
        if due:
            WebhookDelivery.update(next_attempt_at=now + CLAIM).where(
                WebhookDelivery.id.in_([d.id for d in due])
            ).execute()
    return due


def send_due(rt):
    """Send the deliveries that are due (at most BATCH, CONCURRENCY at a time, outside any
    transaction) and record each outcome under the leader's fence; returns counts. Only the leader
    sends: leadership is checked again right before each request, and a replica that stopped
    leading meanwhile records nothing (the new leader sends what is left, with the same ids)."""
    leader = rt.leader
    counts = {"delivered": 0, "retrying": 0, "given_up": 0, "forgotten": 0}
    if not leader.leading():
        return counts
    due = _claim_due(rt.clock.now(), leader)
    allowed = rt.settings.webhook_allowed_networks
    results = {}
    if due:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(CONCURRENCY, len(due))) as pool:
            futures = {
                pool.submit(
                    _post, d.url, d.secret, d.body, d.id, d.kind, allowed, leader.leading
                ): d
                for d in due
            }
            for future in concurrent.futures.as_completed(futures):
                results[futures[future].id] = future.result()
    done_at = rt.clock.now()
    with write_transaction():
        leader.fence()
        for d in due:
            if results[d.id] == NOT_SENT:
                continue
            code, error = results[d.id]
            attempts = d.attempts + 1
            fields = {"attempts": attempts, "status_code": code, "error": error[:ERROR_MAX]}
            if not error:
                fields.update(state=DELIVERED, finished_at=done_at, next_attempt_at=None)
                counts["delivered"] += 1
            elif attempts >= MAX_ATTEMPTS:
                fields.update(
                    state=FAILED,
                    finished_at=done_at,
                    next_attempt_at=None,
                    error=f"gave up after {attempts} attempts; last: {error}"[:ERROR_MAX],
                )
                counts["given_up"] += 1
                log.warning(
                    "webhook delivery %s (%s) given up after %d attempts: %s",
                    d.id,
                    d.kind,
                    attempts,
                    error,
                )
            else:
                fields["next_attempt_at"] = done_at + _backoff(attempts)
                counts["retrying"] += 1
            WebhookDelivery.update(**fields).where(
                (WebhookDelivery.id == d.id) & (WebhookDelivery.state == PENDING)
            ).execute()
        counts["forgotten"] = (
            WebhookDelivery.delete()
            .where(
                (WebhookDelivery.state != PENDING)
                & (WebhookDelivery.finished_at < done_at - KEEP_FINISHED)
            )
            .execute()
        )
    if rt.instruments is not None:
        for outcome in ("delivered", "retrying", "given_up"):
            if counts[outcome]:
                rt.instruments.webhook_deliveries.labels(outcome).inc(counts[outcome])
    return counts
