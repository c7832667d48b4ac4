"""Small helpers the pages share."""

import datetime as dt
import json

from flask import g, redirect, render_template, url_for

from fleetd.errors import Forbidden, NotFound
from fleetd.ui.blueprint import when


def allow(allowed):
    """Forbidden unless the signed-in principal's role is in `allowed`."""
    principal = g.ui_principal
    if principal.role not in allowed:
        raise Forbidden(f"your token's role ({principal.role}) may not do this")
    return principal


def confirmed(form):
    """Whether a POST comes from the confirmation step of an action."""
    return form.get("confirm") == "yes"


def answer_by_name(handle, matches, kind, endpoint, columns):
    """Where a page addressed by `handle` (an id or a name) goes instead of showing itself: nowhere
    (None) when `handle` is the id of its one match; the id's page when a name named exactly one; a
    page that lists them when it named several; NotFound when nothing the viewer may see matched.
    `columns`: (heading, attribute) of what tells the matches apart."""
    if len(matches) == 1 and matches[0].id == handle:
        return None
    if not matches:
        raise NotFound(f"{kind} {handle} not found")
    arg = f"{kind}_id"
    if len(matches) == 1:
        return redirect(url_for(endpoint, **{arg: matches[0].id}))
    rows = [
        {
            "id": m.id,
            "url": url_for(endpoint, **{arg: m.id}),
            "cells": [_shown(getattr(m, attribute)) for _, attribute in columns],
        }
        for m in matches
    ]
    return render_template(
        "handles.html", kind=kind, handle=handle, rows=rows, headings=[h for h, _ in columns]
    )


def _shown(value):
    return when(value) if isinstance(value, dt.datetime) else value


MASK = "\u2022" * 8


def masked_spec_text(spec):
    """A spec as indented JSON for a page, its env values masked (they are often credentials, and a
    page is read over shoulders and in screenshots; the API gives them to their owner)."""
    shown = dict(spec)
    if isinstance(shown.get("env"), dict):
        shown["env"] = {name: MASK for name in shown["env"]}
    return json.dumps(shown, indent=2, sort_keys=True)
