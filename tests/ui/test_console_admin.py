"""The console's admin pages through Flask's test client: fleets (create, change labels, windows and
health policy), quotas, webhooks (secret shown once, deliveries with their status, posted to a
receiver on loopback); the API's errors beside their fields; admins only where the API says so."""

import re

from tests.support.webhooks import receiver  # noqa: F401 - a fixture: a loopback receiver of deliveries
from tests.ui.conftest import enrol
from tests.ui.test_console_forms import field_error


def fleet_form(**fields):
    form = {
        "name": "gpu-b",
        "description": "rack 9",
        "labels": "zone=a, tier=prod",
        "windows": "22:00-06:00 mon,tue\n12:00-13:00",
        "timezone": "Europe/Berlin",
        "cordon_on_gpu_fault": "on",
        "drain_after_minutes": "15",
        "uncordon_when_healthy": "on",
        "allowed_images": "localhost/*, ghcr.io/acme/*",
    }
    form.update(fields)
    return form


def test_create_and_change_a_fleet_as_the_api_would(admin_ui, api):
    admin_ui.get("/ui/fleets")
    created = admin_ui.post("/ui/fleets", fleet_form())
    assert created.status_code == 302 and created.headers["Location"] == "/ui/fleets/gpu-b"
    fleet = api.get("/api/v1/fleets/gpu-b").get_json()
    assert fleet["labels"] == {"zone": "a", "tier": "prod"} and fleet["description"] == "rack 9"
    assert fleet["availability"] == {
        "timezone": "Europe/Berlin",
        "windows": [
            {"start": "22:00", "end": "06:00", "days": ["mon", "tue"]},
            {"start": "12:00", "end": "13:00"},
        ],
    }
    assert fleet["health_policy"] == {
        "cordon_on_gpu_fault": True,
        "drain_after_seconds": 900,
        "uncordon_when_healthy": True,
    }
    assert (
        fleet["allowed_images"] == ["localhost/*", "ghcr.io/acme/*"]
        and fleet["allow_root_tasks"] is False
    )
    page = admin_ui.text("/ui/fleets/gpu-b")
    assert (
        'id="fl-labels" name="labels" class="mono" placeholder="zone=a, tier=prod" '
        'value="tier=prod, zone=a"' in page
    )
    assert "/ui/join-tokens?fleet=gpu-b" in page
    changed = admin_ui.post(
        "/ui/fleets/gpu-b",
        fleet_form(labels="zone=b", windows="", drain_after_minutes="", uncordon_when_healthy=""),
    )
    assert changed.status_code == 302
    fleet = api.get("/api/v1/fleets/gpu-b").get_json()
    assert fleet["labels"] == {"zone": "b"} and fleet["availability"] is None
    assert fleet["health_policy"] == {
        "cordon_on_gpu_fault": True,
        "drain_after_seconds": None,
        "uncordon_when_healthy": False,
    }
    assert 'data-fleet="gpu-b"' in admin_ui.text("/ui/fleets")


def test_fleet_form_errors_stand_beside_their_fields(admin_ui, api):
    admin_ui.get("/ui/fleets")
    bad = admin_ui.post(
        "/ui/fleets",
        fleet_form(name="Not A DNS label", windows="25:00-06:00", timezone="Mars/Olympus"),
    )
    page = bad.get_data(as_text=True)
    assert bad.status_code == 400 and "like a DNS label" in field_error(page, "name")
    assert "HH:MM" in field_error(page, "windows") and "time zone" in field_error(page, "timezone")
    assert "Not A DNS label" in page  # what was typed stays
    labels = admin_ui.post("/ui/fleets", fleet_form(labels="zone"))
    assert "key=value" in field_error(labels.get_data(as_text=True), "labels")
    assert admin_ui.post("/ui/fleets", fleet_form()).status_code == 302
    taken = admin_ui.post("/ui/fleets", fleet_form())
    assert taken.status_code == 400 and "already exists" in taken.get_data(as_text=True)
    assert [f["name"] for f in api.get("/api/v1/fleets").get_json()["items"]] == ["gpu-b"]


def test_set_and_remove_a_quota(admin_ui, api):
    admin_ui.get("/ui/quotas")
    assert (
        admin_ui.post(
            "/ui/quotas", {"team": "vision", "priority_class": "spot", "max_gpus": "8"}
        ).status_code
        == 302
    )
    assert api.get("/api/v1/quotas").get_json()["items"] == [
        {"team": "vision", "priority_class": "spot", "max_gpus": 8.0}
    ]
    page = admin_ui.text("/ui/quotas")
    assert 'data-quota="vision/spot"' in page
    bad = admin_ui.post(
        "/ui/quotas", {"team": "vision", "priority_class": "spot", "max_gpus": "-1"}
    )
    assert bad.status_code == 400 and field_error(bad.get_data(as_text=True), "max_gpus")
    confirm = admin_ui.post("/ui/quotas/vision/remove", {"priority_class": "spot"})
    assert confirm.status_code == 200 and "Remove team vision" in confirm.get_data(as_text=True)
    assert (
        admin_ui.post(
            "/ui/quotas/vision/remove", {"priority_class": "spot", "confirm": "yes"}
        ).status_code
        == 302
    )
    assert api.get("/api/v1/quotas").get_json()["items"] == []


def test_a_webhook_secret_is_generated_and_shown_once(admin_ui, api):
    admin_ui.get("/ui/webhooks")
    created = admin_ui.post(
        "/ui/webhooks", {"url": "http://127.0.0.1:9/hook", "events": ["node.lost", "job.failed"]}
    )
    page = created.get_data(as_text=True)
    assert created.status_code == 200, page
    secret = re.search(r'id="new-secret" class="mono" readonly value="([^"]+)"', page).group(1)
    assert len(secret) >= 32
    hook = api.get("/api/v1/webhooks").get_json()["items"][0]
    assert hook["url"] == "http://127.0.0.1:9/hook" and hook["events"] == [
        "job.failed",
        "node.lost",
    ]
    listing = admin_ui.text("/ui/webhooks")
    assert f'data-webhook="{hook["id"]}"' in listing and secret not in listing
    deliveries = admin_ui.text(f"/ui/webhooks/{hook['id']}")
    assert "No deliveries yet." in deliveries and secret not in deliveries
    refused = admin_ui.post("/ui/webhooks", {"url": "ftp://x", "events": [], "secret": "short"})
    text = refused.get_data(as_text=True)
    assert refused.status_code == 400 and field_error(text, "url") and field_error(text, "events")
    assert field_error(text, "secret") and 'value="short"' not in text
    assert admin_ui.get("/ui/webhooks/00000000000000000000").status_code == 404


def test_the_webhook_page_shows_each_delivery_with_its_status_as_it_is_retried(
    admin_ui, api, clock, receiver
):
    admin_ui.get("/ui/webhooks")
    assert (
        admin_ui.post("/ui/webhooks", {"url": receiver.url, "events": ["job.failed"]}).status_code
        == 200
    )
    [hook] = api.get("/api/v1/webhooks").get_json()["items"]
    _, session = enrol(api)
    job = api.submit(name="doomed", command=["false"])
    api.task_call(session, api.start_task(session), "finish", outcome="failed", exit_code=3)
    assert api.job(job["id"])["state"] == "failed"  # the event a delivery is queued for

    def delivery_row():
        page = admin_ui.text(f"/ui/webhooks/{hook['id']}")
        rows = re.findall(r'<tr data-delivery="([^"]+)">(.*?)</tr>', page, re.S)
        assert len(rows) == 1, page
        cells = [
            re.sub(r"<[^>]+>", "", c).strip()
            for c in re.findall(r"<td[^>]*>(.*?)</td>", rows[0][1], re.S)
        ]
        return rows[0][0], dict(
            zip(("at", "event", "state", "attempts", "status", "error", "next"), cells)
        )

    delivery_id, row = delivery_row()
    assert (row["event"], row["state"], row["attempts"], row["status"]) == (
        "job.failed",
        "pending",
        "0",
        "–",
    )
    receiver.statuses = [503]
    assert api.run_task("webhooks")["retrying"] == 1
    _, row = delivery_row()
    assert (row["state"], row["attempts"], row["status"], row["error"]) == (
        "pending",
        "1",
        "503",
        "HTTP 503",
    )
    assert row["next"] != "–"  # when it is tried again
    clock.advance(5)
    assert api.run_task("webhooks")["delivered"] == 1
    again, row = delivery_row()
    assert again == delivery_id and (
        row["state"],
        row["attempts"],
        row["status"],
        row["error"],
        row["next"],
    ) == ("delivered", "2", "204", "", "–")
    [listed] = api.get(f"/api/v1/webhooks/{hook['id']}/deliveries").get_json()["items"]
    assert (listed["id"], listed["state"], listed["status_code"]) == (delivery_id, "delivered", 204)
    assert len(receiver.requests) == 2 and all(path == "/hook" for path, _, _ in receiver.requests)


def test_submitters_read_fleets_but_not_quotas_webhooks_or_fleet_changes(signed_in, api):
    api.create_fleet("gpu-a")
    alice = signed_in("submitter", "alice")
    page = alice.text("/ui/fleets")
    assert 'data-fleet="gpu-a"' in page and 'id="fleet-form"' not in page
    assert 'id="fleet-edit"' not in alice.text("/ui/fleets/gpu-a")
    assert "Webhooks" not in alice.text("/ui/fleets") and "Quotas" not in page
    for path in ("/ui/quotas", "/ui/webhooks"):
        assert alice.get(path).status_code == 403, path
    assert alice.post("/ui/fleets/gpu-a", fleet_form()).status_code == 403
    assert alice.post("/ui/quotas", {"team": "x", "max_gpus": "1"}).status_code == 403
