"""Join tokens (per fleet) and API tokens: create (secret shown once), list, revoke."""

from flask import flash, g, redirect, render_template, request, url_for

from fleetd.errors import InvalidRequest
from fleetd.models import Role
from fleetd.runtime import current_runtime, public_url
from fleetd.schemas.fleets import JoinTokenCreateSchema
from fleetd.schemas.tokens import TokenCreateSchema
from fleetd.services.fleet_ops import fleets
from fleetd.services.identity import tokens
from fleetd.ui import roles
from fleetd.ui.blueprint import bp
from fleetd.ui.forms import FormError, load_form
from fleetd.ui.pages.common import allow, confirmed
from fleetd.ui.security import ui_require

LIST_LIMIT = 500


def _fleet_tokens(fleet_name):
    return fleets.list_join_tokens(fleet_name, LIST_LIMIT)[0]


def _join_tokens_page(selected, created=None, form=None, errors=None, status=200):
    all_fleets = fleets.list_fleets(1000)[0]
    names = [f.name for f in all_fleets]
    if selected and selected not in names:
        raise InvalidRequest(f"fleet {selected!r} not found")
    shown = [selected] if selected else names
    listing = [(name, _fleet_tokens(name)) for name in shown]
    return render_template(
        "join_tokens.html",
        fleets=names,
        selected=selected,
        listing=listing,
        created=created,
        form=form or {},
        errors=errors or {},
        now=current_runtime().clock.now(),
    ), status


@bp.route("/join-tokens")
@ui_require(roles.JOIN_TOKENS)
def join_tokens():
    """Join tokens of every fleet (or one), without secrets; the form to create one."""
    return _join_tokens_page(request.args.get("fleet") or None)


@bp.route("/join-tokens/create", methods=["POST"])
@ui_require(roles.JOIN_TOKEN_CREATE)
def join_token_create():
    """Mint a join token; its secret and join command are in this response only."""
    rt = current_runtime()
    fleet = request.form.get("fleet", "")
    try:
        body = load_form(JoinTokenCreateSchema(), request.form, multipliers={"ttl_seconds": 3600})
    except FormError as exc:
        return _join_tokens_page(fleet or None, form=request.form, errors=exc.errors, status=400)
    if not fleet:
        return _join_tokens_page(
            None, form=request.form, errors={"fleet": ["choose a fleet"]}, status=400
        )
    row, token = fleets.create_join_token(
        rt.clock.now(), fleet, created_by=g.ui_principal.label, **body
    )
    created = {"row": row, "token": token, "join_command": fleets.join_command(public_url(), token)}
    return _join_tokens_page(fleet, created=created)


@bp.route("/join-tokens/<string:token_id>/revoke", methods=["POST"])
@ui_require(roles.JOIN_TOKEN_REVOKE)
def join_token_revoke(token_id):
    """Revoke a join token after a confirmation step."""
    fleet = request.form.get("fleet") or None
    if not confirmed(request.form):
        return render_template(
            "confirm.html",
            title="Revoke join token",
            question=f"Revoke join token {token_id}? Hosts can no longer enrol with it; "
            "nodes that already joined stay.",
            action=url_for("ui.join_token_revoke", token_id=token_id),
            hidden={"fleet": fleet or ""},
            button="Revoke",
            back=url_for("ui.join_tokens", fleet=fleet),
        )
    fleets.revoke_join_token(token_id)
    flash(f"Join token {token_id} revoked.")
    return redirect(url_for("ui.join_tokens", fleet=fleet))


def _api_tokens_page(created=None, form=None, errors=None, status=200):
    rows = tokens.list_api_tokens(LIST_LIMIT)[0]
    return render_template(
        "api_tokens.html",
        tokens=rows,
        created=created,
        form=form or {},
        errors=errors or {},
        role_names=[r.value for r in Role],
        now=current_runtime().clock.now(),
    ), status


@bp.route("/api-tokens")
@ui_require(roles.API_TOKENS)
def api_tokens():
    """API tokens without secrets; the form to create one."""
    return _api_tokens_page()


@bp.route("/api-tokens/create", methods=["POST"])
@ui_require(roles.API_TOKEN_CREATE)
def api_token_create():
    """Create an API token; its secret is in this response only."""
    try:
        body = load_form(
            TokenCreateSchema(), request.form, multipliers={"expires_in_seconds": 86400}
        )
    except FormError as exc:
        return _api_tokens_page(form=request.form, errors=exc.errors, status=400)
    rt = current_runtime()
    row, token = tokens.create_api_token(
        rt.clock.now(), allowed_system_users=rt.settings.allowed_system_users, **body
    )
    return _api_tokens_page(created={"row": row, "token": token})


@bp.route("/api-tokens/<string:token_id>/revoke", methods=["POST"])
@ui_require(roles.API_TOKEN_REVOKE)
def api_token_revoke(token_id):
    """Revoke an API token after a confirmation step; it stops working at once (this session too, if
    it is yours)."""
    allow(roles.API_TOKEN_REVOKE)
    own = token_id == g.ui_principal.id
    if not confirmed(request.form):
        warning = " This is the token you signed in with: you will be signed out." if own else ""
        return render_template(
            "confirm.html",
            title="Revoke API token",
            question=f"Revoke API token {token_id}? Everything using it stops working at once."
            + warning,
            action=url_for("ui.api_token_revoke", token_id=token_id),
            hidden={},
            button="Revoke",
            back=url_for("ui.api_tokens"),
        )
    tokens.revoke_api_token(current_runtime().clock.now(), token_id)
    flash(f"API token {token_id} revoked.")
    return redirect(url_for("ui.login") if own else url_for("ui.api_tokens"))
