"""The people pages through Flask's test client: users, projects (members, service accounts), the
sign-in settings (providers, binding rules), a user's own profile and the header's project
switcher; each form checked by the API's schemas and services, its errors beside its fields."""

import html

import pytest

from tests.support.http import ApiClient
from tests.ui.conftest import UiClient

SECRET = "s3cr3t-client-secret-value"
JOB_FORM = {
    "mode": "fields",
    "action": "submit",
    "name": "t",
    "command": "x",
    "gpus": "1",
    "num_nodes": "1",
}


def make_user(api, login, role="member", team=None):
    """A user made with its first token (POST /api/v1/tokens with `user`): its token."""
    resp = api.post(
        "/api/v1/tokens", {"name": f"{login}-token", "role": role, "user": login, "team": team}
    )
    assert resp.status_code == 201, resp.get_json()
    return resp.get_json()["token"]


def user_ui(app, api, login, role="member"):
    """A UI client signed in as a new user."""
    client = UiClient(app)
    client.login(make_user(api, login, role))
    return client


def make_project(api, key, **body):
    resp = api.post("/api/v1/projects", dict(key=key, **body))
    assert resp.status_code == 201, resp.get_json()


def add_member(api, key, login, role="member"):
    resp = api.put(f"/api/v1/projects/{key}/members/{login}", {"role": role})
    assert resp.status_code == 200, resp.get_json()


def field_error(page, name):
    """The text beside a form field (the `err` macro), unescaped; None when there is none."""
    marker = f'id="err-{name}"'
    if marker not in page:
        return None
    start = page.index(">", page.index(marker)) + 1
    return html.unescape(page[start : page.index("</span>", start)])


def general_error(page):
    marker = 'id="form-error"><p>'
    if marker not in page:
        return None
    start = page.index(marker) + len(marker)
    return html.unescape(page[start : page.index("</p>", start)])


# ---------------------------------------------------------------- users


def test_users_list_shows_each_user_and_filters_active_and_inactive(admin_ui, api):
    make_user(api, "alice", team="cv")
    make_user(api, "bob")
    assert api.patch("/api/v1/users/bob", {"active": False}).status_code == 200
    page = admin_ui.text("/ui/users")
    assert 'data-user="alice"' in page and 'data-user="bob"' in page
    row = page[
        page.index('data-user="alice"') : page.index("</tr>", page.index('data-user="alice"'))
    ]
    for cell in ("alice", "member", "cv", "token", "active"):
        assert cell in row, cell
    active = admin_ui.text("/ui/users?active=true")
    assert 'data-user="alice"' in active and 'data-user="bob"' not in active
    inactive = admin_ui.text("/ui/users?active=false")
    assert 'data-user="bob"' in inactive and 'data-user="alice"' not in inactive
    assert admin_ui.get("/ui/users?active=maybe").status_code == 400
    assert admin_ui.get("/ui/users?cursor=%00bad").status_code == 400


def test_users_list_pages_with_a_cursor(admin_ui, api, monkeypatch):
    from fleetd.ui.pages import users as users_page

    monkeypatch.setattr(users_page, "LIST_LIMIT", 1)
    make_user(api, "alice")
    make_user(api, "bob")
    first = admin_ui.text("/ui/users")
    assert first.count("data-user=") == 1 and 'id="next-page"' in first
    link = html.unescape(first.split('id="next-page"')[0].rsplit('href="', 1)[1].split('"')[0])
    second = admin_ui.text(link)
    assert second.count("data-user=") == 1
    assert second.split("data-user=")[1][:8] != first.split("data-user=")[1][:8]


def test_a_users_page_shows_its_projects_and_tokens_and_changes_role_and_default_project(
    admin_ui, api
):
    make_user(api, "alice")
    make_project(api, "vision")
    add_member(api, "vision", "alice", "admin")
    page = admin_ui.text("/ui/users/alice")
    assert 'data-project="vision"' in page and 'data-project="default"' in page
    assert "alice-token" in page and "fla_" not in page  # tokens by name, never a secret
    resp = admin_ui.post("/ui/users/alice", {"role": "operator", "default_project": "vision"})
    assert resp.status_code == 302
    user = api.get("/api/v1/users/alice").get_json()
    assert (user["role"], user["default_project"]) == ("operator", "vision")
    assert "default project vision" in admin_ui.text("/ui/users/alice")

    bad = admin_ui.post("/ui/users/alice", {"role": "emperor", "default_project": "vision"})
    assert bad.status_code == 400 and "Must be one of" in field_error(bad.get_data(True), "role")
    api.patch("/api/v1/users/alice", {"role": "member"})
    other = admin_ui.post("/ui/users/alice", {"role": "member", "default_project": "nlp-x"})
    assert other.status_code == 400
    assert "no project 'nlp-x'" in field_error(other.get_data(True), "default_project")
    assert api.get("/api/v1/users/alice").get_json()["default_project"] == "vision"
    assert admin_ui.get("/ui/users/nobody").status_code == 404


def test_deactivating_a_user_asks_first_then_ends_its_sign_in_and_activating_lets_it_back(
    app, admin_ui, api
):
    alice = user_ui(app, api, "alice")
    assert alice.get("/ui/profile").status_code == 200
    admin_ui.get("/ui/users/alice")
    confirm = admin_ui.post("/ui/users/alice/active", {"active": "false"})
    assert confirm.status_code == 200 and "Deactivate user alice?" in confirm.get_data(True)
    assert api.get("/api/v1/users/alice").get_json()["active"] is True  # nothing yet
    done = admin_ui.post("/ui/users/alice/active", {"active": "false", "confirm": "yes"})
    assert done.status_code == 302
    assert api.get("/api/v1/users/alice").get_json()["active"] is False
    assert "/ui/login" in alice.get("/ui/profile").headers["Location"]  # signed out at once
    assert "inactive" in admin_ui.text("/ui/users/alice")
    admin_ui.post("/ui/users/alice/active", {"active": "true", "confirm": "yes"})
    assert api.get("/api/v1/users/alice").get_json()["active"] is True
    assert admin_ui.post("/ui/users/alice/active", {"active": "x"}).status_code == 400


def test_deleting_a_user_asks_first_then_takes_it_out_of_its_projects(admin_ui, api):
    make_user(api, "alice")
    make_project(api, "vision")
    add_member(api, "vision", "alice")
    admin_ui.get("/ui/users/alice")
    confirm = admin_ui.post("/ui/users/alice/delete")
    assert confirm.status_code == 200 and "Delete user alice?" in confirm.get_data(True)
    assert admin_ui.post("/ui/users/alice/delete", {"confirm": "yes"}).status_code == 302
    user = api.get("/api/v1/users/alice").get_json()
    assert user["active"] is False and user["default_project"] is None
    members = api.get("/api/v1/projects/vision/members").get_json()["items"]
    assert members == []


# ---------------------------------------------------------------- projects


def test_projects_are_created_edited_and_their_members_managed_through_the_pages(admin_ui, api):
    make_user(api, "alice")
    form = {"key": "vision", "name": "vision", "display_name": "Vision", "team": "cv"}
    admin_ui.get("/ui/projects")
    resp = admin_ui.post("/ui/projects", dict(form, description="Cameras"))
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/ui/projects/vision")
    assert 'data-project="vision"' in admin_ui.text("/ui/projects")
    project = api.get("/api/v1/projects/vision").get_json()
    assert (project["display_name"], project["team"], project["description"]) == (
        "Vision",
        "cv",
        "Cameras",
    )

    added = admin_ui.post("/ui/projects/vision/members", {"login": "alice", "role": "member"})
    assert added.status_code == 302
    page = admin_ui.text("/ui/projects/vision")
    assert 'data-member="alice"' in page
    admin_ui.post("/ui/projects/vision/members", {"login": "alice", "role": "admin"})
    members = api.get("/api/v1/projects/vision/members").get_json()["items"]
    assert [(m["login"], m["role"]) for m in members] == [("alice", "admin")]

    confirm = admin_ui.post("/ui/projects/vision/members/alice/remove")
    assert "Take alice out of project vision?" in confirm.get_data(True)
    admin_ui.post("/ui/projects/vision/members/alice/remove", {"confirm": "yes"})
    assert api.get("/api/v1/projects/vision/members").get_json()["items"] == []

    edit = {"name": "vision", "display_name": "Vision 2", "team": "", "description": ""}
    assert admin_ui.post("/ui/projects/vision/edit", edit).status_code == 302
    project = api.get("/api/v1/projects/vision").get_json()
    assert (project["display_name"], project["team"]) == ("Vision 2", None)
    bad = admin_ui.post("/ui/projects/vision/edit", dict(edit, display_name=""))
    assert bad.status_code == 400 and field_error(bad.get_data(True), "display_name")

    assert "Delete project vision?" in admin_ui.post("/ui/projects/vision/delete").get_data(True)
    assert admin_ui.post("/ui/projects/vision/delete", {"confirm": "yes"}).status_code == 302
    assert api.get("/api/v1/projects/vision").status_code == 404


def test_a_service_account_token_is_shown_once_and_listed_without_it(admin_ui, api):
    make_project(api, "vision")
    admin_ui.get("/ui/projects/vision")
    resp = admin_ui.post(
        "/ui/projects/vision/service-accounts", {"name": "ci", "expires_in_seconds": "30"}
    )
    page = resp.get_data(as_text=True)
    assert resp.status_code == 200 and 'id="created-service-account"' in page
    token = page.split('id="new-token" class="mono" readonly value="')[1].split('"')[0]
    assert token.startswith("fla_")
    again = admin_ui.text("/ui/projects/vision")
    assert token not in again and "created-service-account" not in again
    assert 'id="service-accounts"' in again and ">ci<" in again
    ci = ApiClient(api.app, token)
    assert ci.get("/api/v1/whoami").get_json()["projects"] == [{"key": "vision", "role": "member"}]
    for value, words in (("", "required"), ("500", "less than or equal"), ("nan", None)):
        bad = admin_ui.post(
            "/ui/projects/vision/service-accounts", {"name": "ci2", "expires_in_seconds": value}
        )
        assert bad.status_code == 400, value
        message = field_error(bad.get_data(True), "expires_in_seconds")
        assert message and (words is None or words in message), (value, message)


def test_the_project_forms_show_the_services_refusals_on_the_form(admin_ui, api):
    make_project(api, "vision")
    admin_ui.get("/ui/projects")
    bad_key = admin_ui.post("/ui/projects", {"key": "Not A Key"})
    assert bad_key.status_code == 400 and "a key is 2 to 32" in field_error(
        bad_key.get_data(True), "key"
    )
    taken = admin_ui.post("/ui/projects", {"key": "vision"})
    assert taken.status_code == 400 and "project 'vision' exists" in general_error(
        taken.get_data(True)
    )
    nobody = admin_ui.post("/ui/projects/vision/members", {"login": "nobody", "role": "member"})
    assert nobody.status_code == 400 and "user nobody not found" in general_error(
        nobody.get_data(True)
    )
    role = admin_ui.post("/ui/projects/vision/members", {"login": "x", "role": "owner"})
    assert role.status_code == 400 and "Must be one of" in field_error(role.get_data(True), "role")
    assert admin_ui.get("/ui/projects/nope").status_code == 404
    assert admin_ui.post("/ui/projects/nope/members", {"login": "a"}).status_code == 404


def test_the_default_project_cannot_be_deleted_and_the_page_says_why(admin_ui, api):
    api.submit(name="j", resources={"gpus": 1})  # makes the project `default` when missing
    admin_ui.get("/ui/projects/default")
    resp = admin_ui.post("/ui/projects/default/delete", {"confirm": "yes"})
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/ui/projects/default")
    page = admin_ui.text("/ui/projects/default")
    assert "the project `default` holds the work of tokens without a project" in html.unescape(page)
    assert 'class="flash flash-error"' in page
    assert api.get("/api/v1/projects/default").status_code == 200


def test_a_project_admin_manages_its_members_but_not_other_projects_or_admin_pages(
    app, admin_ui, api
):
    make_user(api, "bob")
    alice = user_ui(app, api, "alice")
    make_project(api, "vision")
    make_project(api, "nlp")
    add_member(api, "vision", "alice", "admin")
    listing = alice.text("/ui/projects")
    assert 'data-project="vision"' in listing and 'data-project="nlp"' not in listing
    assert 'id="project-form"' not in listing  # no create form for a member
    page = alice.text("/ui/projects/vision")
    assert 'id="member-form"' in page and 'id="project-edit"' not in page
    assert (
        alice.post("/ui/projects/vision/members", {"login": "bob", "role": "member"}).status_code
        == 302
    )
    assert "bob" in [
        m["login"] for m in api.get("/api/v1/projects/vision/members").get_json()["items"]
    ]
    assert alice.get("/ui/projects/nlp").status_code == 404
    assert alice.post("/ui/projects", {"key": "mine"}).status_code == 403
    assert alice.post("/ui/projects/vision/delete", {"confirm": "yes"}).status_code == 403
    add_member(api, "nlp", "alice", "viewer")
    viewer_page = alice.text("/ui/projects/nlp")
    assert 'id="member-form"' not in viewer_page and 'id="account-form"' not in viewer_page
    refused = alice.post("/ui/projects/nlp/members", {"login": "bob", "role": "admin"})
    assert refused.status_code == 403 and "only an admin" in refused.get_data(True)
    assert alice.post("/ui/projects/nlp/service-accounts", {"name": "x"}).status_code == 403


# ---------------------------------------------------------------- roles, profile, CSRF


ADMIN_ONLY = ["/ui/users", "/ui/users/alice", "/ui/sign-in"]


def test_a_member_gets_403_on_the_admin_pages_but_sees_its_profile(app, api):
    alice = user_ui(app, api, "alice")
    alice.get("/ui/profile")
    for path in ADMIN_ONLY:
        resp = alice.get(path)
        assert resp.status_code == 403, path
        assert "may not open this page" in resp.get_data(as_text=True)
    for path, form in (
        ("/ui/users/alice", {"role": "admin"}),
        ("/ui/users/alice/active", {"active": "false", "confirm": "yes"}),
        ("/ui/users/alice/delete", {"confirm": "yes"}),
        ("/ui/sign-in/providers", {"name": "lab", "kind": "jwt"}),
        ("/ui/sign-in/bindings", {}),
        ("/ui/projects", {"key": "mine"}),
    ):
        assert alice.post(path, form).status_code == 403, path
    assert api.get("/api/v1/users/alice").get_json()["role"] == "member"
    page = alice.text("/ui/profile")
    assert 'id="p-login">alice<' in page and 'id="p-default-project">default<' in page
    assert 'data-limit="max_active_jobs"' in page and 'data-project="default"' in page
    assert "alice-token" in page and "this sign-in" in page and "fla_" not in page
    nav = page.split("</nav>")[0]
    assert ">Projects<" in nav and ">Users<" not in nav and ">Sign-in<" not in nav
    assert 'id="profile-link"' in page


def test_the_profile_of_a_token_without_a_user_shows_its_limits(admin_ui):
    page = admin_ui.text("/ui/profile")
    assert "token:admin" in page and 'data-limit="max_instances"' in page
    assert "no user owns it" in page
    nav = page.split("</nav>")[0]
    assert ">Users<" in nav and ">Projects<" in nav and ">Sign-in<" in nav


@pytest.mark.parametrize(
    "path,form",
    [
        ("/ui/users/alice", {"role": "admin"}),
        ("/ui/users/alice/active", {"active": "false", "confirm": "yes"}),
        ("/ui/users/alice/delete", {"confirm": "yes"}),
        ("/ui/projects", {"key": "mine"}),
        ("/ui/projects/vision/edit", {"display_name": "x"}),
        ("/ui/projects/vision/delete", {"confirm": "yes"}),
        ("/ui/projects/vision/members", {"login": "alice", "role": "admin"}),
        ("/ui/projects/vision/members/alice/remove", {"confirm": "yes"}),
        ("/ui/projects/vision/service-accounts", {"name": "ci", "expires_in_seconds": "1"}),
        ("/ui/sign-in/providers", {"name": "lab", "kind": "jwt", "issuer": "https://a.example"}),
        ("/ui/sign-in/providers/lab/delete", {"confirm": "yes"}),
        ("/ui/sign-in/bindings", {}),
        ("/ui/project", {"project": "vision"}),
    ],
)
def test_the_people_forms_without_the_csrf_token_are_refused_and_change_nothing(
    admin_ui, api, path, form
):
    make_user(api, "alice")
    make_project(api, "vision")
    add_member(api, "vision", "alice")
    api.put("/api/v1/auth/providers/lab", {"kind": "jwt", "issuer": "https://a", "audience": "f"})
    admin_ui.get("/ui/profile")
    resp = admin_ui.post(path, form, csrf=False)
    assert resp.status_code == 400 and "did not come from this site" in resp.get_data(True)
    assert api.get("/api/v1/users/alice").get_json()["role"] == "member"
    assert api.get("/api/v1/users/alice").get_json()["active"] is True
    assert api.get("/api/v1/projects/vision").get_json()["display_name"] == "vision"
    assert api.get("/api/v1/projects/mine").status_code == 404
    members = api.get("/api/v1/projects/vision/members").get_json()["items"]
    assert [(m["login"], m["role"]) for m in members] == [("alice", "member")]
    assert api.get("/api/v1/projects/vision/service-accounts").get_json()["items"] == []
    assert api.get("/api/v1/auth/providers/lab").get_json()["kind"] == "jwt"
    assert 'value="vision" selected' not in admin_ui.text("/ui/profile")


# ---------------------------------------------------------------- sign-in settings


def _provider(**fields):
    form = {
        "name": "lab",
        "kind": "oidc",
        "issuer": "https://idp.example/realms/lab",
        "client_id": "fleetd",
        "client_secret": SECRET,
        "scopes": "openid profile groups",
        "claim_login": "email",
    }
    form.update(fields)
    return form


def test_providers_are_added_and_changed_and_a_client_secret_is_never_shown(admin_ui, api):
    admin_ui.get("/ui/sign-in")
    assert admin_ui.post("/ui/sign-in/providers", _provider()).status_code == 302
    stored = api.get("/api/v1/auth/providers/lab").get_json()
    assert stored["has_client_secret"] is True and stored["scopes"] == [
        "openid",
        "profile",
        "groups",
    ]
    assert stored["claims"] == {"login": "email"}
    listing = admin_ui.text("/ui/sign-in")
    assert 'data-provider="lab"' in listing and ">stored<" in listing and SECRET not in listing
    page = admin_ui.text("/ui/sign-in/providers/lab")
    assert SECRET not in page and 'value="fleetd"' in page and 'value="email"' in page
    # Saving without a secret keeps the stored one; an error page never echoes the typed one.
    keep = _provider(client_secret="", client_id="fleetd-2", editing="yes")
    assert admin_ui.post("/ui/sign-in/providers", keep).status_code == 302
    stored = api.get("/api/v1/auth/providers/lab").get_json()
    assert stored["client_id"] == "fleetd-2" and stored["has_client_secret"] is True
    bad = admin_ui.post("/ui/sign-in/providers", _provider(editing="yes", claim_login="bad claim"))
    assert bad.status_code == 400 and SECRET not in bad.get_data(True)
    assert "a claim name" in field_error(bad.get_data(True), "claim_login")
    clear = _provider(client_secret="", clear_secret="on", editing="yes")
    assert admin_ui.post("/ui/sign-in/providers", clear).status_code == 302
    assert api.get("/api/v1/auth/providers/lab").get_json()["has_client_secret"] is False

    confirm = admin_ui.post("/ui/sign-in/providers/lab/delete")
    assert "Remove identity provider lab?" in confirm.get_data(True)
    admin_ui.post("/ui/sign-in/providers/lab/delete", {"confirm": "yes"})
    assert api.get("/api/v1/auth/providers/lab").status_code == 404


def test_the_provider_form_shows_each_refusal_beside_its_field(admin_ui, api):
    admin_ui.get("/ui/sign-in")
    cases = [
        (_provider(name="Bad Name"), "name", "a provider name"),
        (_provider(issuer="ftp://x"), "issuer", "an http(s) URL"),
        (_provider(kind="saml"), "kind", "Must be one of"),
        (_provider(client_id=""), "client_id", "required for kind oidc"),
        (_provider(kind="jwt", audience=""), "audience", "required for kind jwt"),
        (_provider(scopes='open"id'), "scopes", "String does not match"),
    ]
    for form, field, words in cases:
        resp = admin_ui.post("/ui/sign-in/providers", form)
        page = resp.get_data(as_text=True)
        assert resp.status_code == 400, field
        assert words in (field_error(page, field) or ""), (field, field_error(page, field))
        assert SECRET not in page
    assert api.get("/api/v1/auth/providers").get_json()["items"] == []


def _rules(*rows):
    """Rows of the binding rules form: (position, provider, claim, test, value, role, team,
    projects)."""
    names = ("position", "provider", "claim", "test", "value", "role", "team", "projects")
    form = {f"rule_{name}": [] for name in names}
    for row in rows:
        for name, value in zip(names, row, strict=True):
            form[f"rule_{name}"].append(value)
    return form


def test_binding_rules_are_saved_in_the_order_of_their_positions(admin_ui, api):
    api.put("/api/v1/auth/providers/lab", {"kind": "jwt", "issuer": "https://a", "audience": "f"})
    make_project(api, "vision")
    admin_ui.get("/ui/sign-in")
    form = _rules(
        ("2", "lab", "groups", "contains", "staff", "member", "", "vision=member"),
        ("1", "lab", "groups", "equals", "ops", "admin", "infra", ""),
        ("3", "", "", "contains", "", "member", "", ""),  # an empty spare row
    )
    resp = admin_ui.post("/ui/sign-in/bindings", form)
    assert resp.status_code == 302, resp.get_data(True)[:2000]
    rules = api.get("/api/v1/auth/bindings").get_json()
    assert [(r["role"], r.get("equals"), r.get("contains")) for r in rules] == [
        ("admin", "ops", None),
        ("member", None, "staff"),
    ]
    assert rules[1]["projects"] == [{"project": "vision", "role": "member"}]
    assert rules[0]["team"] == "infra"
    page = admin_ui.text("/ui/sign-in")
    assert page.count('class="rule-row"') == 4  # two rules and two spare rows
    assert 'value="vision=member"' in page
    removed = dict(form, rule_remove=["0"])
    assert admin_ui.post("/ui/sign-in/bindings", removed).status_code == 302
    assert [r["role"] for r in api.get("/api/v1/auth/bindings").get_json()] == ["admin"]


def test_a_refused_binding_rule_is_named_by_its_row_and_nothing_is_stored(admin_ui, api):
    api.put("/api/v1/auth/providers/lab", {"kind": "jwt", "issuer": "https://a", "audience": "f"})
    good = ("1", "lab", "groups", "contains", "staff", "member", "", "")
    admin_ui.get("/ui/sign-in")
    cases = [
        (("2", "nope", "groups", "contains", "x", "member", "", ""), "no such provider"),
        (("2", "lab", "groups", "contains", "x", "member", "", "ghost=member"), "no project"),
        (("2", "lab", "groups", "contains", "x", "member", "", "vision"), "project"),
        (("2", "lab", "bad claim", "contains", "x", "member", "", ""), "a claim name"),
        (("2", "lab", "groups", "contains", "x", "emperor", "", ""), "Must be one of"),
        (("2", "lab", "groups", "regex", "x", "member", "", ""), "Unknown field"),
        (("2", "lab", "groups", "contains", "\x00", "member", "", ""), None),
        (
            ("2", "lab", "groups", "contains", "x" * 300, "member", "", ""),
            "Length must be between 0 and 255",
        ),
    ]
    for row, words in cases:
        resp = admin_ui.post("/ui/sign-in/bindings", _rules(good, row))
        page = html.unescape(resp.get_data(as_text=True))
        assert resp.status_code == 400, row
        assert 'id="err-rule-1"' in page and 'id="err-rule-0"' not in page, row
        message = page.split('id="err-rule-1">')[1].split("</p>")[0]
        assert message.startswith("Rule 2:") and (words is None or words in message), message
    assert api.get("/api/v1/auth/bindings").get_json() == []


# ---------------------------------------------------------------- the project switcher


def test_the_project_switcher_sets_the_deploy_forms_default_project(app, api):
    alice = user_ui(app, api, "alice")
    make_project(api, "vision")
    add_member(api, "vision", "alice")
    page = alice.text("/ui/profile")
    switcher = page.split('id="project-switcher"')[1].split("</form>")[0]
    assert 'value="default" selected' in switcher and 'value="vision"' in switcher
    resp = alice.post("/ui/project", {"project": "vision", "next": "/ui/jobs/new"})
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/ui/jobs/new")
    assert 'id="j-project" name="project"' in (form := alice.text("/ui/jobs/new"))
    assert 'list="j-project-choices" value="vision"' in form
    assert 'list="i-project-choices" value="vision"' in alice.text("/ui/instances/new")
    assert 'value="vision" selected' in alice.text("/ui/profile")
    created = alice.post("/ui/jobs/new", dict(JOB_FORM, project="vision"))
    assert created.status_code == 302, created.get_data(True)[:1500]
    job_id = created.headers["Location"].rsplit("/", 1)[1]
    assert api.get(f"/api/v1/jobs/{job_id}").get_json()["project"] == "vision"

    refused = alice.post("/ui/project", {"project": "nlp", "next": "//evil.example/"})
    assert refused.headers["Location"].endswith("/ui/profile")
    assert "you have no project 'nlp'" in html.unescape(alice.text("/ui/profile"))
    assert 'value="vision" selected' in alice.text("/ui/profile")  # the choice stays
    make_project(api, "nlp")
    other = alice.post("/ui/jobs/new", dict(JOB_FORM, project="nlp"))
    assert other.status_code == 400
    assert "may not submit to project 'nlp'" in field_error(other.get_data(True), "project")
    unknown = alice.post("/ui/instances/new", {"name": "i", "command": "x", "project": "ghost"})
    assert unknown.status_code == 400
    assert "no project 'ghost'" in field_error(unknown.get_data(True), "project")
