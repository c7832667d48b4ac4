"""Hostile input to every console form through Flask's test client: a readable refusal (400) or a
create, never a server error, never a traceback, and for a refusal nothing stored."""

from tests.ui.test_console_admin import fleet_form
from tests.ui.test_console_forms import deploy_form

ODD = ["1e400", "nan", "-0", "\x00", "é" * 300, "9" * 5000, "'unbalanced", "a=b=c/udp"]
LAUGHS = (
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
    )
    + "name: t\ncommand: [x]\nlabels: *i\n"
)


def _no_server_error(resp):
    text = resp.get_data(as_text=True)
    assert resp.status_code < 500 and "Traceback" not in text, text[:500]
    return resp.status_code


def test_the_deploy_form_refuses_odd_values_readably(admin_ui, api):
    admin_ui.get("/ui/instances/new")
    for field in (
        "name",
        "gpus",
        "gpu_type",
        "image",
        "command",
        "ports",
        "volume_gib",
        "volume_mount_path",
        "bid",
        "restart",
        "idle_below",
        "idle_minutes",
        "priority_class",
        "env_name",
    ):
        for i, value in enumerate(ODD):
            status = _no_server_error(
                admin_ui.post(
                    "/ui/instances/new", deploy_form(**{"name": f"{field}-{i}", field: value})
                )
            )
            assert status in (302, 400), (field, value)


def test_the_job_form_and_spec_box_refuse_odd_values_readably(admin_ui, api):
    admin_ui.get("/ui/jobs/new")
    base = {"mode": "fields", "name": "t", "command": "x", "gpus": "1", "num_nodes": "1"}
    for field in (
        "gpus",
        "num_nodes",
        "max_runtime",
        "bid",
        "gpu_type",
        "fleet",
        "command",
        "name",
    ):
        for i, value in enumerate(ODD):  # each value once, checked or submitted in turn
            action = ("check", "submit")[i % 2]
            _no_server_error(
                admin_ui.post("/ui/jobs/new", dict(base, **{field: value, "action": action}))
            )
    before = len(api.get("/api/v1/jobs").get_json()["items"])
    for spec in [
        "[" * 5000 + "]" * 5000,
        "{a: " * 3000 + "1" + "}" * 3000,
        LAUGHS,
        "!!python/object:os.system x",
        "- a\n- b",
        "name: t\ncommand: x",
        "\x00",
        "name: t\ncommand: [x]\nresources: {gpus: .nan}",
        "name: t\ncommand: [x]\nnum_nodes: 1e400",
    ]:
        resp = admin_ui.post("/ui/jobs/new", {"mode": "spec", "action": "submit", "spec": spec})
        assert _no_server_error(resp) == 400, spec[:40]
    assert (
        len(api.get("/api/v1/jobs").get_json()["items"]) == before
    )  # no refused spec stored anything


def test_the_admin_forms_refuse_odd_values_readably(admin_ui, api):
    admin_ui.get("/ui/fleets")
    for field in (
        "name",
        "labels",
        "windows",
        "timezone",
        "drain_after_minutes",
        "allowed_images",
        "description",
    ):
        for value in ODD:
            _no_server_error(admin_ui.post("/ui/fleets", fleet_form(**{field: value})))
            _no_server_error(admin_ui.post("/ui/fleets/gpu-b", fleet_form(**{field: value})))
    for value in ODD:
        _no_server_error(
            admin_ui.post("/ui/quotas", {"team": value, "priority_class": value, "max_gpus": value})
        )
        _no_server_error(
            admin_ui.post(f"/ui/quotas/{value.strip() or 'x'}/remove", {"priority_class": value})
        )
        _no_server_error(
            admin_ui.post("/ui/webhooks", {"url": value, "events": [value], "secret": value})
        )
    for path in (
        "/ui/usage?days=x",
        "/ui/usage?team=%00",
        "/ui/jobs/x/log?after=x",
        "/ui/jobs?name=%25",
        "/ui/instances?fleet=%00",
        "/ui/webhooks/%00",
    ):
        _no_server_error(admin_ui.get(path))


def test_the_people_and_sign_in_forms_refuse_odd_values_readably(admin_ui, api):
    api.post("/api/v1/tokens", {"name": "alice-token", "role": "member", "user": "alice"})
    api.post("/api/v1/projects", {"key": "vision"})
    admin_ui.get("/ui/projects")
    before = {
        "users": api.get("/api/v1/users").get_json()["items"],
        "projects": api.get("/api/v1/projects").get_json()["items"],
        "providers": api.get("/api/v1/auth/providers").get_json()["items"],
    }
    for value in ODD + ['{"a": [1,', "[" * 500]:
        key = value.strip() or "x"
        for path, form in (
            ("/ui/users/alice", {"role": value, "default_project": value}),
            ("/ui/users/alice/active", {"active": value}),
            (f"/ui/users/{key}/delete", {}),
            ("/ui/projects", {"key": value, "name": value, "team": value, "description": value}),
            ("/ui/projects/vision/edit", {"name": value, "display_name": value, "team": value}),
            (f"/ui/projects/{key}/delete", {"confirm": "yes"}),
            ("/ui/projects/vision/members", {"login": value, "role": value}),
            ("/ui/projects/vision/members", {"login": "alice", "role": value}),
            (f"/ui/projects/vision/members/{key}/remove", {"confirm": "yes"}),
            ("/ui/projects/vision/service-accounts", {"name": value, "expires_in_seconds": value}),
            ("/ui/sign-in/providers", {"name": value, "kind": value, "issuer": value}),
            (
                "/ui/sign-in/providers",
                {"name": "lab", "kind": "oidc", "issuer": value, "client_id": value},
            ),
            ("/ui/sign-in/providers", {"name": "lab", "editing": "yes", "scopes": value}),
            ("/ui/sign-in/providers", {"name": "lab", "claim_login": value, "kind": "jwt"}),
            (f"/ui/sign-in/providers/{key}/delete", {}),
            (
                "/ui/sign-in/bindings",
                {f"rule_{f}": [value] for f in ("position", "provider", "claim", "test", "value")},
            ),
            ("/ui/sign-in/bindings", {"rule_claim": ["g"], "rule_projects": [value]}),
            ("/ui/sign-in/bindings", {"rule_claim": ["g"], "rule_role": [value]}),
            ("/ui/project", {"project": value, "next": value}),
            ("/ui/jobs/new", {"mode": "fields", "name": "t", "command": "x", "project": value}),
        ):
            _no_server_error(admin_ui.post(path, form))
    for path in (
        "/ui/users?active=%00",
        "/ui/users/%00",
        "/ui/projects/%00",
        "/ui/projects?cursor=x",
    ):
        _no_server_error(admin_ui.get(path))
    _no_server_error(admin_ui.get("/ui/sign-in/providers/%00"))
    assert api.get("/api/v1/users").get_json()["items"] == before["users"]
    # Odd names are names (the edit form may keep one); no project came or went.
    keys = [p["key"] for p in api.get("/api/v1/projects").get_json()["items"]]
    assert keys == [p["key"] for p in before["projects"]]
    assert api.get("/api/v1/auth/providers").get_json()["items"] == before["providers"]
    assert api.get("/api/v1/auth/bindings").get_json() == []
