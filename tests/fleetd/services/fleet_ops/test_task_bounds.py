"""What bounds each task (issue 44): a fleet's task defaults (`task_pids_max`,
`task_memory_default_bytes`, `task_path`), a spec's `resources.pids`, and the assignments that carry
them to the node."""

import pytest

from fleetwire.assignment import Assignment
from tests.support import wire

GIB = 1024**3
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_a_fleet_bounds_tasks_by_default_and_an_admin_changes_its_bounds(api):
    fleet = api.create_fleet("gpu-a")
    assert (fleet["task_pids_max"], fleet["task_memory_default_bytes"], fleet["task_path"]) == (
        4096,
        32 * GIB,
        PATH,
    )
    resp = api.patch(
        "/api/v1/fleets/gpu-a",
        {
            "task_pids_max": 512,
            "task_memory_default_bytes": 8 * GIB,
            "task_path": "/opt/conda/bin:/usr/bin:/bin",
        },
    )
    assert resp.status_code == 200, resp.get_json()
    changed = api.get("/api/v1/fleets/gpu-a").get_json()
    assert (
        changed["task_pids_max"],
        changed["task_memory_default_bytes"],
        changed["task_path"],
    ) == (512, 8 * GIB, "/opt/conda/bin:/usr/bin:/bin")
    made = api.create_fleet(
        "gpu-b", task_pids_max=100, task_memory_default_bytes=GIB, task_path="/usr/bin"
    )
    assert (made["task_pids_max"], made["task_memory_default_bytes"], made["task_path"]) == (
        100,
        GIB,
        "/usr/bin",
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("task_pids_max", 0),
        ("task_pids_max", 15),
        ("task_pids_max", 4 * 1024 * 1024 + 1),
        ("task_pids_max", "64"),
        ("task_pids_max", None),
        ("task_memory_default_bytes", None),  # no bound at all is not a choice: a huge one is
        ("task_memory_default_bytes", 1024),
        ("task_memory_default_bytes", 2**51),
        ("task_memory_default_bytes", 1.5),
        ("task_path", ""),
        ("task_path", "bin:/usr/bin"),
        ("task_path", "/usr/bin::/bin"),
        ("task_path", "/usr/bin:"),
        ("task_path", "/usr/bin:."),
        ("task_path", "/usr/bin\n"),
        ("task_path", "/" + "a" * 4096),
        ("task_path", None),
    ],
)
def test_a_fleet_refuses_task_bounds_out_of_range(api, field, value):
    api.create_fleet("gpu-a")
    within = {"task_pids_max": 16, "task_memory_default_bytes": 64 * 1024**2, "task_path": "/bin"}[
        field
    ]
    assert (
        api.patch("/api/v1/fleets/gpu-a", {field: within}).status_code == 200
    )  # the bound itself is taken
    resp = api.patch("/api/v1/fleets/gpu-a", {field: value})
    assert resp.status_code == 400, resp.get_json()
    assert field in resp.get_json()["error"]["details"]["fields"]["json"]
    assert api.post("/api/v1/fleets", {"name": "gpu-b", field: value}).status_code == 400


@pytest.mark.parametrize("pids", [0, 15, 4 * 1024 * 1024 + 1, "64", True, 64.5])
def test_a_spec_pid_limit_out_of_range_is_refused_for_jobs_and_instances(api, pids):
    for within in (16, 4 * 1024 * 1024):
        assert (
            api.post(
                "/api/v1/jobs",
                {"name": "j", "command": ["true"], "resources": {"gpus": 0, "pids": within}},
            ).status_code
            == 201
        )
    resp = api.post(
        "/api/v1/jobs", {"name": "j", "command": ["true"], "resources": {"gpus": 0, "pids": pids}}
    )
    assert (
        resp.status_code == 400
        and "pids" in resp.get_json()["error"]["details"]["fields"]["json"]["resources"]
    )
    resp = api.post(
        "/api/v1/instances", {"name": "i", "command": ["sleep", "1d"], "resources": {"pids": pids}}
    )
    assert (
        resp.status_code == 400
        and "pids" in resp.get_json()["error"]["details"]["fields"]["json"]["resources"]
    )


def test_each_assignment_carries_its_pid_limit_memory_bound_and_path_from_its_spec_and_its_fleet(
    api,
):
    api.create_fleet(
        "gpu-a", task_pids_max=100, task_memory_default_bytes=GIB, task_path="/opt/x/bin:/usr/bin"
    )
    _node_id, session = api.ready_node(api.create_join_token("gpu-a"), "host-a", gpu_count=4)
    said = api.submit(name="says-nothing", resources={"gpus": 1})
    assert (
        "pids" not in said["spec"]["resources"]
    )  # optional: a spec that says nothing stores nothing
    own = api.submit(
        name="says-its-own", resources={"gpus": 1, "pids": 50, "memory_bytes": 2 * GIB}
    )
    assert own["spec"]["resources"]["pids"] == 50
    api.submit(name="asks-too-much", resources={"gpus": 1, "pids": 5000})
    made = api.post(
        "/api/v1/instances",
        {"name": "web", "command": ["sleep", "1d"], "resources": {"gpus": 1, "pids": 20}},
    )
    assert made.status_code == 201, made.get_json()
    assert made.get_json()["spec"]["resources"]["pids"] == 20
    reply = api.post(
        "/api/v1/agent/acquire",
        {"wait_seconds": 0, "max_assignments": 64},
        token=session,
        agent=True,
    ).get_json()
    by_name = {}
    for sent in reply["assignments"]:
        parsed = Assignment.from_wire(sent)  # the agent takes each of them
        name = (
            parsed.instance.name if parsed.instance is not None else api.job(parsed.job_id)["name"]
        )
        by_name[name] = (parsed.pids, parsed.memory_bytes, parsed.memory_default, parsed.task_path)
    assert by_name == {
        "says-nothing": (
            100,
            GIB,
            True,
            "/opt/x/bin:/usr/bin",
        ),  # the fleet's pid limit and memory bound
        "says-its-own": (50, 2 * GIB, False, "/opt/x/bin:/usr/bin"),  # fewer pids, its own memory
        "asks-too-much": (
            100,
            GIB,
            True,
            "/opt/x/bin:/usr/bin",
        ),  # never more than the fleet's task_pids_max
        "web": (20, GIB, True, "/opt/x/bin:/usr/bin"),
    }


@pytest.mark.parametrize(
    "field, value",
    [("pids", 15), ("pids", "64"), ("task_path", "bin"), ("task_path", "/a::/b"), ("task_path", 7)],
)
def test_the_agent_refuses_an_assignment_whose_bounds_are_malformed(field, value):
    data = wire.assignment("t-bad", ["true"], valid=False, **{field: value})
    with pytest.raises(ValueError, match=field):
        Assignment.from_wire(data)
