"""Sign-in settings (admins): identity providers (create, change, remove; a client secret is
write-only and never shown) and the ordered binding rules, a row per rule, over the API's schemas
and services."""

import math
import re

from flask import flash, redirect, render_template, request, url_for
from marshmallow import ValidationError

from fleetd.credentials import PROJECT_ROLES, USER_ROLES
from fleetd.runtime import current_runtime
from fleetd.schemas.auth import BindingSchema, ProviderPutSchema
from fleetd.services.identity import oidc, signin
from fleetd.ui import roles, specforms
from fleetd.ui.blueprint import bp
from fleetd.ui.forms import FormError, parse_number
from fleetd.ui.pages.common import confirmed
from fleetd.ui.security import ui_require

CLAIM_FIELDS = ("login", "display_name", "email", "groups", "uid", "gid", "groups_gids")
PROVIDER_FIELDS = {f"claims.{name}": f"claim_{name}" for name in CLAIM_FIELDS}
RULE_FIELDS = ("provider", "claim", "test", "value", "role", "team", "projects")
TESTS = ("contains", "equals")
RULES_MAX = 1000  # as PUT /api/v1/auth/bindings
SPARE_RULES = 2
KINDS = ("oidc", "jwt")


# ---------------------------------------------------------------- providers


def provider_body(form):
    """The provider form -> the body of PUT /api/v1/auth/providers/{name}: an empty secret keeps
    the stored one (left out), "clear" removes it."""
    body = {"kind": form.get("kind", ""), "issuer": form.get("issuer", "").strip()}
    for field in ("client_id", "audience", "jwks_url"):
        body[field] = form.get(field, "").strip() or None
    secret = form.get("client_secret", "").strip()
    if specforms.checked(form, "clear_secret"):
        body["client_secret"] = None
    elif secret:
        body["client_secret"] = secret
    body["scopes"] = [s for s in re.split(r"[\s,]+", form.get("scopes", "")) if s] or None
    claims = {name: form.get(f"claim_{name}", "").strip() for name in CLAIM_FIELDS}
    body["claims"] = {name: value for name, value in claims.items() if value} or None
    return body


def provider_form_values(provider):
    """A provider's fields as its form shows them: never its client secret."""
    values = {
        "name": provider.name,
        "kind": provider.kind,
        "issuer": provider.issuer,
        "client_id": provider.client_id or "",
        "audience": provider.audience or "",
        "jwks_url": provider.jwks_url or "",
        "scopes": " ".join(provider.scopes or []),
    }
    for name, claim in (provider.claims or {}).items():
        values[f"claim_{name}"] = claim or ""
    return values


def _provider_form_choices():
    return {
        "kinds": KINDS,
        "claim_fields": CLAIM_FIELDS,
        "default_claims": oidc.DEFAULT_CLAIMS,
        "default_scopes": " ".join(oidc.DEFAULT_SCOPES),
    }


def _settings_page(provider_form=None, errors=None, rules=None, status=200):
    providers = oidc.list_providers()
    return render_template(
        "sign_in_settings.html",
        providers=providers,
        form=provider_form or {"kind": "oidc"},
        errors=errors or {},
        rule_rows=rules if rules is not None else [rule_row(r) for r in signin.get_bindings()],
        rule_providers=[p.name for p in providers] + [signin.SCIM_PROVIDER],
        spare=SPARE_RULES,
        user_roles=USER_ROLES,
        project_roles=PROJECT_ROLES,
        tests=TESTS,
        **_provider_form_choices(),
    ), status


def _provider_page(name, form=None, errors=None, status=200):
    provider = oidc.get_provider(name)
    return render_template(
        "provider.html",
        provider=provider,
        form=form or provider_form_values(provider),
        errors=errors or {},
        **_provider_form_choices(),
    ), status


@bp.route("/sign-in")
@ui_require(roles.SIGN_IN_SETTINGS)
def sign_in_settings():
    """Identity providers and binding rules; the forms that change them."""
    return _settings_page()


@bp.route("/sign-in/providers/<string:name>")
@ui_require(roles.PROVIDER)
def provider_page(name):
    """A provider's form filled in with what is stored (its client secret never shown)."""
    return _provider_page(name)


@bp.route("/sign-in/providers", methods=["POST"])
@ui_require(roles.PROVIDER_SET)
def provider_set():
    """Create or replace a provider (PUT /api/v1/auth/providers/{name})."""
    rt = current_runtime()
    name = request.form.get("name", "").strip()
    editing = request.form.get("editing") == "yes"
    try:
        if not oidc.PROVIDER_NAME_RE.fullmatch(name):
            raise FormError(
                {"name": ["a provider name: a-z, 0-9 and -, a letter first, at most 64"]}
            )
        body = specforms.load(ProviderPutSchema(), provider_body(request.form), PROVIDER_FIELDS)
        specforms.run_service(
            lambda: oidc.put_provider(rt, rt.clock.now(), name, body), PROVIDER_FIELDS
        )
    except FormError as exc:
        if editing and oidc.PROVIDER_NAME_RE.fullmatch(name):
            return _provider_page(name, request.form, exc.errors, 400)
        return _settings_page(request.form, exc.errors, status=400)
    flash(f"Provider {name} saved.")
    return redirect(url_for("ui.sign_in_settings"))


@bp.route("/sign-in/providers/<string:name>/delete", methods=["POST"])
@ui_require(roles.PROVIDER_DELETE)
def provider_delete(name):
    """Remove a provider after a confirmation step; its users' sessions end at their next
    refresh."""
    rt = current_runtime()
    oidc.get_provider(name)
    if not confirmed(request.form):
        return render_template(
            "confirm.html",
            title="Remove provider",
            question=f"Remove identity provider {name}? Nobody can sign in with it any more, and "
            "the sessions of its users end at their next refresh.",
            action=url_for("ui.provider_delete", name=name),
            hidden={},
            button="Remove",
            back=url_for("ui.sign_in_settings"),
        )
    oidc.delete_provider(rt, rt.clock.now(), name)
    flash(f"Provider {name} removed.")
    return redirect(url_for("ui.sign_in_settings"))


# ---------------------------------------------------------------- binding rules


def rule_row(rule):
    """A stored rule as its row of the form."""
    test = "equals" if rule.get("equals") is not None else "contains"
    return {
        "provider": rule.get("provider", ""),
        "claim": rule.get("claim", ""),
        "test": test,
        "value": rule.get(test) or "",
        "role": rule.get("role", ""),
        "team": rule.get("team") or "",
        "projects": ", ".join(f"{p['project']}={p['role']}" for p in rule.get("projects") or ()),
    }


def _position(raw, index):
    value = parse_number((raw or "").strip())
    if isinstance(value, (int, float)) and math.isfinite(value):
        return value
    return index


def rule_rows(form):
    """The form's rows in the order their positions say; empty and removed rows left out."""
    columns = {f: form.getlist(f"rule_{f}") for f in RULE_FIELDS}
    positions = form.getlist("rule_position")
    removed = set(form.getlist("rule_remove"))
    count = min(max(len(c) for c in columns.values()), RULES_MAX + SPARE_RULES + 1)
    kept = []
    for i in range(count):
        row = {f: (col[i] if i < len(col) else "").strip() for f, col in columns.items()}
        if str(i) in removed or not any(row[f] for f in ("claim", "value", "team", "projects")):
            continue
        kept.append((_position(positions[i] if i < len(positions) else "", i + 1), i, row))
    kept.sort(key=lambda item: (item[0], item[1]))
    return [row for _, _, row in kept]


def _projects(text):
    """ "vision=member, nlp" -> [{project, role}] (a piece without a role: None, for the schema to
    refuse)."""
    pairs = []
    for piece in (p.strip() for p in text.split(",")):
        if piece:
            key, _, role = piece.partition("=")
            pairs.append({"project": key.strip(), "role": role.strip() or None})
    return pairs


def rule_body(row):
    """A row -> one rule of PUT /api/v1/auth/bindings (an unknown test is passed on as a field of
    its own, for the schema to refuse)."""
    return {
        "provider": row["provider"],
        "claim": row["claim"],
        row["test"] if row["test"] in TESTS else f"test {row['test'][:32]}": row["value"],
        "role": row["role"],
        "team": row["team"] or None,
        "projects": _projects(row["projects"]),
    }


def _row_errors(messages):
    """The schema's messages per rule ({0: {claim: [...]}}) -> {"0": ["claim: ..."]}."""
    out: dict[str, list[str]] = {}
    for path, texts in specforms.flatten(messages).items():
        row, _, rest = path.partition(".")
        rest = "" if rest == "_schema" else rest
        out.setdefault(row, []).extend(f"{rest}: {t}" if rest else t for t in texts)
    return out


@bp.route("/sign-in/bindings", methods=["POST"])
@ui_require(roles.BINDINGS_SET)
def bindings_set():
    """Replace the binding rules (PUT /api/v1/auth/bindings) with the form's rows, in order."""
    now = current_runtime().clock.now()
    rows = rule_rows(request.form)
    try:
        if len(rows) > RULES_MAX:
            raise FormError({specforms.GENERAL: [f"at most {RULES_MAX} binding rules"]})
        try:
            rules = BindingSchema(many=True).load([rule_body(row) for row in rows])
        except ValidationError as exc:
            raise FormError(_row_errors(exc.messages)) from None
        specforms.run_service(lambda: signin.put_bindings(now, rules), {})
    except FormError as exc:
        return _settings_page(errors={"rules": exc.errors}, rules=rows, status=400)
    flash(f"{len(rules)} binding rule(s) saved.")
    return redirect(url_for("ui.sign_in_settings"))
