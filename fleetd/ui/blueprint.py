"""The `ui` blueprint: session sign-in, CSRF on every POST, HTML errors, security headers."""

import datetime as dt
import logging
import math

from flask import Blueprint, g, redirect, render_template, request, url_for
from markupsafe import Markup, escape
from werkzeug.exceptions import HTTPException

from fleetd.auth import enter_actor
from fleetd.clock import isoformat
from fleetd.errors import FleetdError
from fleetd.runtime import current_runtime
from fleetd.services.identity.users import find_user
from fleetd.ui import roles, switcher
from fleetd.ui.forms import FormError
from fleetd.ui.security import CSRF_FIELD, SignInRequired, check_csrf, csrf_token, session_principal

log = logging.getLogger(__name__)

bp = Blueprint(
    "ui",
    __name__,
    url_prefix="/ui",
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)

PUBLIC = frozenset({"ui.login", "ui.static"})

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src "
    "'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'"
)


@bp.before_request
def _load_session():
    """Resolve the session's token on every request; check the CSRF token of every POST."""
    g.ui_principal = None
    if request.endpoint == "ui.static":
        return None
    rt = current_runtime()
    g.ui_principal = session_principal(rt, rt.clock.now())
    if g.ui_principal is not None:
        enter_actor(g.ui_principal)
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        check_csrf()
    return None


@bp.after_request
def security_headers(response):
    """No caching of pages that show fleet state or secrets; no framing; a strict CSP."""
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    if request.endpoint != "ui.static":
        response.headers["Cache-Control"] = "no-store"
    return response


@bp.context_processor
def _context():
    principal = g.get("ui_principal")
    nav = [
        (endpoint, label)
        for endpoint, label, allowed in roles.NAV
        if principal is not None and principal.role in allowed
    ]
    return {
        "principal": principal,
        "nav": nav,
        "csrf_token": csrf_token,
        "csrf_field": CSRF_FIELD,
        "roles": roles,
        "may": lambda allowed: principal is not None and principal.role in allowed,
        "signed_in_user": lambda: find_user(principal.user_id) if principal else None,
        "project_choices": lambda: switcher.choices(principal),
        "current_project": lambda: switcher.chosen(principal),
    }


@bp.errorhandler(SignInRequired)
def _to_sign_in(_error):
    if request.headers.get("HX-Request"):
        # htmx follows redirects inside the page; tell it to load the sign-in page instead.
        return "", 401, {"HX-Redirect": url_for("ui.login")}
    target = request.full_path if request.method == "GET" else None
    return redirect(url_for("ui.login", next=target.rstrip("?") if target else None))


@bp.errorhandler(FleetdError)
def _fleetd_error(error):
    status = error.http_status
    if status >= 500:
        log.error("admin UI: %s", error.message)
    fields = error.errors if isinstance(error, FormError) else {}
    return (
        render_template(
            "error.html", status=status, code=error.code, message=error.message, fields=fields
        ),
        status,
        {k: v for k, v in error.headers.items() if k == "Retry-After"},
    )


@bp.errorhandler(HTTPException)
def _http_error(error):
    status = error.code or 500
    message = (
        error.description
        if status < 500
        else "something went wrong on the server; see fleetd's log"
    )
    return render_template(
        "error.html", status=status, code=error.name, message=message, fields={}
    ), status


@bp.errorhandler(Exception)
def _unexpected(error):
    log.error("admin UI: unhandled error", exc_info=error)
    return render_template(
        "error.html",
        status=500,
        code="internal",
        message="something went wrong on the server; see fleetd's log",
        fields={},
    ), 500


@bp.route("/<path:_rest>")
def not_found(_rest):
    """Any other path under /ui/: a readable 404."""
    return render_template(
        "error.html", status=404, code="not_found", message="there is no such page", fields={}
    ), 404


# ---------------------------------------------------------------- template filters


@bp.app_template_filter("gib")
def gib(value):
    """Bytes as GiB with one decimal, or an en dash."""
    if value is None:
        return "\u2013"
    return f"{value / 2**30:.1f} GiB"


@bp.app_template_filter("num")
def num(value):
    """A count that may be fractional (queued GPU demand): no trailing .0."""
    if value is None:
        return "\u2013"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.3g}" if value < 1 else f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{int(value)}"


@bp.app_template_filter("when")
def when(value):
    """A <time> element in UTC that the page's script rewrites in the reader's time zone."""
    if value is None or value == "":
        return Markup('<span class="muted">never</span>')
    iso = value if isinstance(value, str) else isoformat(value)
    text = iso.replace("T", " ")[:19] + " UTC"
    return Markup(f'<time datetime="{escape(iso)}" data-local>{escape(text)}</time>')  # nosec B704  # both values escaped


@bp.app_template_filter("age")
def age(value, now=None):
    """How long ago a naive UTC datetime was, in the largest sensible unit."""
    if value is None:
        return "never"
    now = now or current_runtime().clock.now()
    seconds = (now - value).total_seconds() if isinstance(value, dt.datetime) else float(value)
    if seconds < 0:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{math.floor(seconds / size)} {unit} ago"
    return f"{int(seconds)} s ago"


@bp.app_template_filter("duration")
def duration(seconds):
    """A length of time in seconds as people read it: 45 s, 12 min, 3 h 07 min, 2 d 4 h."""
    if seconds is None:
        return "\u2013"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"
