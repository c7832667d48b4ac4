"""Webhooks: receivers of event notifications, an outbox of deliveries written in the transaction of
the event that causes them, and the sender (the `webhooks` background task) that signs, posts and
retries them with back-off."""

import concurrent.futures
import datetime as dt
import hashlib
import hmac
import json
import logging

import requests

from fleetd.clock import isoformat
from fleetd.db import write_transaction
from fleetd.errors import NotFound
from fleetd.models import Webhook, WebhookDelivery, new_id
from fleetd.services.pagination import paginate

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Fleetd-Signature"

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
MAX_ATTEMPTS = 8  # then the delivery is given up (state failed, its last error kept)
BACKOFF_SECONDS = (5, 15, 60, 300, 900, 1800, 3600)  # before attempt 2, 3, ...
BATCH = 100  # deliveries one sender run takes at most
CONCURRENCY = 8  # requests in flight at once
CONNECT_TIMEOUT, READ_TIMEOUT = 5.0, 10.0
KEEP_FINISHED = dt.timedelta(days=7)  # delivered or given-up deliveries are listed this long
ERROR_MAX = 500


def _node_kind(from_status, to_status):
    if to_status == "lost":
        return "node.lost"
    if from_status == "lost" and to_status not in (None, "revoked"):
        return "node.returned"
    if to_status == "drained":
        return "node.drained"
    return None


# Which stored events notify, by event kind: fn(from_status, to_status) -> webhook kind or None.
_NOTIFYING = {
    "node.status": _node_kind,
    "node.health": lambda _f, _t: "node.health",
    "job.state": lambda _f, to: "job.failed" if to == "failed" else None,
    "instance.state": lambda _f, to: "instance.interrupted" if to == "interrupted" else None,
    "leader.changed": lambda _f, _t: "leader.changed",
}


def webhook_kind(kind, from_status, to_status):
    """The webhook kind an Event of `kind` notifies, or None (most events notify nobody)."""
    decide = _NOTIFYING.get(kind)
    return decide(from_status, to_status) if decide is not None else None


def enqueue(now, kind, subject, data):
    """Queue a delivery of this notification to every webhook that receives `kind` (inside the
    transaction of the event: the delivery exists exactly when the event does)."""
    hooks = [h.id for h in Webhook.select(Webhook.id, Webhook.events) if kind in (h.events or ())]
    rows = []
    for hook_id in hooks:
        delivery_id = new_id()
        body = json.dumps({"id": delivery_id, "kind": kind, "at": isoformat(now), "subject": subject, "data": data},
                          sort_keys=True, separators=(",", ":"))
        rows.append({"id": delivery_id, "webhook": hook_id, "kind": kind, "at": now, "body": body, "state": PENDING,
                     "attempts": 0, "next_attempt_at": now, "error": ""})
    if rows:
        WebhookDelivery.insert_many(rows).execute()
    return len(rows)


def sign(secret, body):
    """The signature header's value: sha256=<hex HMAC-SHA256 of the body with the secret>."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


# ---------------------------------------------------------------- admin: the webhooks themselves


def create_webhook(now, principal, url, secret, events):
    """Store a webhook; the secret is kept to sign deliveries and never shown again."""
    with write_transaction():
        return Webhook.create(id=new_id(), url=url, secret=secret, events=sorted(set(events)), created_at=now,
                              created_by=principal.label if principal is not None else "")


def list_webhooks(limit, cursor=None):
    return paginate(Webhook.select(Webhook.id, Webhook.url, Webhook.events, Webhook.created_at,
                                   Webhook.created_by), Webhook.id, limit, cursor)


def delete_webhook(webhook_id):
    """Forget a webhook and its deliveries (those still pending are not sent)."""
    with write_transaction():
        if Webhook.get_or_none_by_id(webhook_id) is None:
            raise NotFound(f"webhook {webhook_id} not found")
        WebhookDelivery.delete().where(WebhookDelivery.webhook == webhook_id).execute()
        Webhook.delete().where(Webhook.id == webhook_id).execute()


def list_deliveries(webhook_id, limit, cursor=None):
    """A webhook's deliveries, oldest first."""
    if Webhook.get_or_none_by_id(webhook_id) is None:
        raise NotFound(f"webhook {webhook_id} not found")
    query = WebhookDelivery.select(WebhookDelivery.id, WebhookDelivery.kind, WebhookDelivery.at,
                                   WebhookDelivery.state, WebhookDelivery.attempts, WebhookDelivery.status_code,
                                   WebhookDelivery.error, WebhookDelivery.next_attempt_at,
                                   WebhookDelivery.finished_at).where(WebhookDelivery.webhook == webhook_id)
    return paginate(query, WebhookDelivery.id, limit, cursor)


# ---------------------------------------------------------------- the sender


def _post(url, secret, body, delivery_id, kind):
    """One attempt: (status_code or None, error or ""). Never follows a redirect (a 3xx is a
    failure: the receiver must name its final URL); reads no response body."""
    raw = body.encode("utf-8")
    headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(secret, raw),
               "X-Fleetd-Delivery": delivery_id, "X-Fleetd-Event": kind, "User-Agent": "fleetd-webhooks"}
    try:
        with requests.post(url, data=raw, headers=headers, timeout=(CONNECT_TIMEOUT, READ_TIMEOUT),
                           allow_redirects=False, stream=True) as resp:
            code = resp.status_code
    except (requests.RequestException, ValueError, UnicodeError, OSError) as exc:  # unreachable, refused, bad name
        return None, _describe(exc)
    if 200 <= code < 300:
        return code, ""
    if 300 <= code < 400:
        return code, f"HTTP {code}: redirects are not followed"
    return code, f"HTTP {code}"


def _describe(exc):
    """A request error in a few words, without the URL (it may carry a token in its query)."""
    kind = type(exc).__name__
    if isinstance(exc, requests.Timeout):
        return f"{kind}: no answer within {CONNECT_TIMEOUT:g}s (connect) / {READ_TIMEOUT:g}s (read)"
    if isinstance(exc, requests.ConnectionError):
        return f"{kind}: could not connect"
    return kind


def _backoff(attempts):
    return dt.timedelta(seconds=BACKOFF_SECONDS[min(attempts - 1, len(BACKOFF_SECONDS) - 1)])


def send_due(rt, fence=None):
    """Send the deliveries that are due (at most BATCH, CONCURRENCY at a time, outside any
    transaction) and record each outcome; returns counts. `fence`: the leader's check."""
    now = rt.clock.now()
    due = list(WebhookDelivery.select(WebhookDelivery.id, WebhookDelivery.kind, WebhookDelivery.body,
                                      WebhookDelivery.attempts, Webhook.url, Webhook.secret)
               .join(Webhook, on=(WebhookDelivery.webhook == Webhook.id))
               .where((WebhookDelivery.state == PENDING) & (WebhookDelivery.next_attempt_at <= now))
               .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id).limit(BATCH).objects())
    results = {}
    if due:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(CONCURRENCY, len(due))) as pool:
            futures = {pool.submit(_post, d.url, d.secret, d.body, d.id, d.kind): d for d in due}
            for future in concurrent.futures.as_completed(futures):
                results[futures[future].id] = future.result()
    counts = {"delivered": 0, "retrying": 0, "given_up": 0}
    done_at = rt.clock.now()
    with write_transaction():
        if fence is not None:
            fence()
        for d in due:
            code, error = results[d.id]
            attempts = d.attempts + 1
            fields = {"attempts": attempts, "status_code": code, "error": error[:ERROR_MAX]}
            if not error:
                fields.update(state=DELIVERED, finished_at=done_at, next_attempt_at=None)
                counts["delivered"] += 1
            elif attempts >= MAX_ATTEMPTS:
                fields.update(state=FAILED, finished_at=done_at, next_attempt_at=None,
                              error=f"gave up after {attempts} attempts; last: {error}"[:ERROR_MAX])
                counts["given_up"] += 1
                log.warning("webhook delivery %s (%s) given up after %d attempts: %s", d.id, d.kind, attempts, error)
            else:
                fields["next_attempt_at"] = done_at + _backoff(attempts)
                counts["retrying"] += 1
            WebhookDelivery.update(**fields).where((WebhookDelivery.id == d.id)
                                                   & (WebhookDelivery.state == PENDING)).execute()
        counts["forgotten"] = WebhookDelivery.delete().where(
            (WebhookDelivery.state != PENDING) & (WebhookDelivery.finished_at < done_at - KEEP_FINISHED)).execute()
    if rt.instruments is not None:
        for outcome in ("delivered", "retrying", "given_up"):
            if counts[outcome]:
                rt.instruments.webhook_deliveries.labels(outcome).inc(counts[outcome])
    return counts

