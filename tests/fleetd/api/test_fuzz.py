"""Random bodies and query strings on every route: never a 500, always the envelope, nothing
half-written."""

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import admin_client
from tests.fleetd.test_auth import ROLE_TABLE
from tests.support.examples import examples

pytestmark = pytest.mark.sweep  # fuzzers: the full tier (scripts/test.sh --fast leaves them out)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
# Bodies that look like the real ones, with some fields replaced by anything.
known_fields = st.sampled_from(
    [
        "name",
        "role",
        "description",
        "labels",
        "ttl_seconds",
        "max_uses",
        "reason",
        "deadline_seconds",
        "hostname",
        "machine_id",
        "agent_version",
        "address",
        "resources",
        "gpus",
        "tasks",
        "metrics",
        "expires_in_seconds",
        "team",
        "finishes",
        "task_id",
        "epoch",
        "outcome",
    ]
)
bodies = json_values | st.dictionaries(known_fields, json_values, max_size=6)
queries = st.dictionaries(
    st.sampled_from(["limit", "cursor", "after", "fleet", "status", "x"]),
    st.text(max_size=20),
    max_size=3,
)


# A browser's sign-in answers its own refusals with a page, not the error envelope.
BROWSER_ROUTES = ("/api/v1/auth/login/{provider}", "/api/v1/auth/callback/{provider}")


def _fuzz(api, session, join, method, path):
    agent = path.startswith("/api/v1/agent/")
    token = join if path == "/api/v1/agent/register" else session
    url = re.sub(r"\{[a-z_]+\}", "gpu-a", path)

    @settings(
        max_examples=examples(40),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(body=bodies, query=queries)
    def check(body, query):
        resp = api.call(
            method,
            url,
            token=token if agent else api.token,
            agent=agent,
            json=body if method in ("POST", "PATCH", "PUT") else None,
            query_string=query,
        )
        assert resp.status_code < 500, (method, url, body, resp.get_data(as_text=True))
        if resp.status_code >= 400 and path in BROWSER_ROUTES and resp.mimetype == "text/html":
            pass  # a page for a person (a URL fleetd refuses before the view is the envelope)
        elif resp.status_code >= 400:
            assert set(resp.get_json()) == {"error"}

    check()


def test_no_route_answers_500_to_random_input(make_app, clock):
    api = admin_client(make_app(long_poll_max_seconds=0), clock)  # long polls answer at once here
    api.create_fleet("gpu-a")
    session = api.register(api.create_join_token("gpu-a"))["session_token"]
    join = api.create_join_token("gpu-a")
    for method, path in sorted(ROLE_TABLE):
        if (method, path) in (
            ("POST", "/api/v1/agent/deregister"),
            ("DELETE", "/api/v1/fleets/{name}"),
        ):
            continue  # no body; would only end the session or the fleet under test
        _fuzz(api, session, join, method, path)


def test_fleet_create_is_all_or_nothing_under_random_input(api):
    @settings(
        max_examples=examples(150),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(
        body=st.fixed_dictionaries(
            {"name": st.text(max_size=70)},
            optional={"description": json_values, "labels": json_values},
        )
    )
    def check(body):
        before = api.get("/api/v1/fleets?limit=1000").get_json()["items"]
        resp = api.post("/api/v1/fleets", body)
        after = api.get("/api/v1/fleets?limit=1000").get_json()["items"]
        if resp.status_code == 201:
            assert len(after) == len(before) + 1
        else:
            assert resp.status_code in (400, 409) and after == before

    check()
