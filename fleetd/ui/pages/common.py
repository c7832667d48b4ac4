"""Small helpers the pages share."""

from flask import g

from fleetd.errors import Forbidden


def allow(allowed):
    """Forbidden unless the signed-in principal's role is in `allowed`."""
    principal = g.ui_principal
    if principal.role not in allowed:
        raise Forbidden(f"your token's role ({principal.role}) may not do this")
    return principal


def confirmed(form):
    """Whether a POST comes from the confirmation step of an action."""
    return form.get("confirm") == "yes"
