"""GET /api/v1/config shows the effective settings with secrets redacted (admins only); GPU types
have display names and manufacturers, are read one by id, and give their lowest prices per GPU
count."""

from urllib.parse import quote

from fleetd.services.fleet_ops.config import effective_config
from fleetd.settings import Settings
from tests.conftest import ApiClient

H100 = "NVIDIA H100 80GB HBM3"


def test_config_shows_the_effective_settings_to_admins_only(api):
    resp = api.get("/api/v1/config")
    assert resp.status_code == 200, resp.get_json()
    body = resp.get_json()
    assert body["settings"]["long_poll_max_seconds"] == 0.5  # the tests' own value, not the default
    assert body["settings"]["heartbeat_interval_seconds"] == 10
    assert body["derived"]["database_url"].startswith("sqlite:///") and body["redacted"] == []
    submitter = ApiClient(api.app, api.create_token("submitter"))
    assert submitter.get("/api/v1/config").get_json()["error"]["code"] == "forbidden"


def test_config_redacts_the_password_of_a_database_url():
    settings = Settings.load(
        environ={"FLEETD_DB_URL": "postgresql://fleetd:hunter2@db.internal:5432/fleetd"}
    )
    config = effective_config(settings, environ={"FLEETD_CONFIG": "/etc/fleetd/fleetd.toml"})
    assert "hunter2" not in str(config)
    assert config["settings"]["db_url"] == "postgresql://fleetd:(redacted)@db.internal:5432/fleetd"
    assert config["derived"]["database_url"] == config["settings"]["db_url"]
    assert (
        config["redacted"] == ["database_url", "db_url"]
        and config["config_file"] == "/etc/fleetd/fleetd.toml"
    )


def test_config_redacts_secret_query_parameters_of_a_database_url():
    url = "postgresql://db.internal/fleetd?sslmode=require&password=hunter2&SSLPassword=s3cr%26t&application_name=f"
    config = effective_config(Settings.load(environ={"FLEETD_DB_URL": url}), environ={})
    assert "hunter2" not in str(config) and "s3cr" not in str(config)
    assert config["settings"]["db_url"] == (
        "postgresql://db.internal/fleetd?sslmode=require&password=(redacted)"
        "&SSLPassword=(redacted)&application_name=f"
    )
    assert config["redacted"] == ["database_url", "db_url"]
    plain = "postgresql://db.internal/fleetd?sslmode=require"
    assert (
        effective_config(Settings.load(environ={"FLEETD_DB_URL": plain}), environ={})["settings"][
            "db_url"
        ]
        == plain
    )


def test_a_gpu_type_is_read_by_id_with_its_display_name_and_lowest_prices(api):
    api.create_fleet()
    api.ready_node(api.create_join_token(), "a", gpu_count=4)
    assert (
        api.call(
            "PUT",
            f"/api/v1/gpu-types/{quote(H100)}",
            json={"price_per_hour": 2.5, "spot_min_bid": 0.8},
        ).status_code
        == 200
    )
    listed = api.get("/api/v1/gpu-types").get_json()["items"]
    assert [(t["model"], t["display_name"], t["manufacturer"]) for t in listed] == [
        (H100, "H100 80GB HBM3", "NVIDIA")
    ]

    one = api.get(f"/api/v1/gpu-types/{quote(H100)}?gpu_count=4").get_json()
    assert (one["model"], one["max_per_node"], one["price_per_hour"]) == (H100, 4, 2.5)
    assert one["lowest_price"] == {
        "gpu_count": 4,
        "available": True,
        "minimum_bid_price": 0.8,
        "uninterruptable_price": 2.5,
    }
    # More than any node has: not available, no price.
    assert api.get(f"/api/v1/gpu-types/{quote(H100)}?gpu_count=5").get_json()["lowest_price"] == {
        "gpu_count": 5,
        "available": False,
        "minimum_bid_price": None,
        "uninterruptable_price": None,
    }
    assert "lowest_price" not in api.get(f"/api/v1/gpu-types/{quote(H100)}").get_json()

    missing = api.get("/api/v1/gpu-types/NVIDIA%20B200")
    assert missing.status_code == 404 and missing.get_json()["error"]["code"] == "not_found"
    assert api.get(f"/api/v1/gpu-types/{quote(H100)}?gpu_count=0").status_code == 400
    submitter = ApiClient(api.app, api.create_token("submitter"))
    assert submitter.get(f"/api/v1/gpu-types/{quote(H100)}").status_code == 200


def test_display_names_drop_the_vendor_and_brand_as_gpu_clouds_show_them():
    from fleetd.services.placement.capacity import display_name

    assert display_name("NVIDIA GeForce RTX 3090") == ("NVIDIA", "RTX 3090")
    assert display_name("NVIDIA RTX A6000") == ("NVIDIA", "RTX A6000")
    assert display_name("AMD Instinct MI300X") == ("AMD", "Instinct MI300X")
    assert display_name("Tesla T4") == (None, "Tesla T4")  # no vendor named: kept as reported
