"""A client that no one here wrote: openapi-python-client generates one from a real fleetd's
/api/openapi.json with its default settings, and that client enrols a node, lists nodes, creates and
reads an instance, and submits and reads back a job."""

import importlib
import json
import os
import subprocess
import sys
import urllib.request

import pytest

pytest.importorskip(
    "openapi_python_client", reason="openapi-python-client needs Python 3.11 or newer (setup.cfg)"
)

pytestmark = pytest.mark.integration

PACKAGE = "fleetd_client"  # what the generator names the package of an API titled "fleetd"


@pytest.fixture
def generated(server, tmp_path):
    """The generated client package, imported from `tmp_path` (and forgotten again afterwards)."""
    spec = tmp_path / "openapi.json"
    with urllib.request.urlopen(f"{server.url}/api/openapi.json", timeout=30) as answer:  # nosec B310 - loopback URL of the test's server
        spec.write_bytes(answer.read())
    bin_dir = os.path.dirname(sys.executable)  # the generator formats with ruff from the same venv
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "openapi_python_client",
            "generate",
            "--path",
            str(spec),
            "--output-path",
            str(tmp_path / "client"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # Default settings, and nothing dropped: a warning is how the generator says it left a model
    # out.
    assert "Warning" not in out.stdout + out.stderr, out.stdout + out.stderr
    sys.path.insert(0, str(tmp_path / "client"))
    try:
        yield lambda name: importlib.import_module(f"{PACKAGE}.{name}")
    finally:
        sys.path.remove(str(tmp_path / "client"))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def test_generated_client_enrols_a_node_lists_it_and_reads_back_an_instance_and_a_job(
    server, admin, generated
):
    client_mod, models = generated("client"), generated("models")
    api = client_mod.AuthenticatedClient(
        base_url=server.url, token=admin, raise_on_unexpected_status=True
    )

    generated("api.fleets.post_api_v1_fleets").sync(
        client=api, body=models.FleetCreate.from_dict({"name": "gen", "allow_root_tasks": True})
    )
    join = generated("api.fleets.post_api_v1_fleets_name_join_tokens").sync(
        "gen", client=api, body=models.JoinTokenCreate.from_dict({})
    )
    agent = client_mod.AuthenticatedClient(
        base_url=server.url, token=join.token, raise_on_unexpected_status=True
    )
    gpu = {"uuid": "GPU-gen-0", "index": 0, "model": "NVIDIA L4", "memory_total_bytes": 24 << 30}
    registered = generated("api.agent.post_api_v1_agent_register").sync(
        client=agent,
        x_fleet_protocol="1",
        body=models.Register.from_dict(
            {
                "hostname": "gen-host",
                "machine_id": "gen-machine",
                "agent_version": "test",
                "address": "127.0.0.1",
                "resources": {"cpu_count": 8, "memory_bytes": 32 << 30},
                "gpus": [gpu],
            }
        ),
    )
    node = client_mod.AuthenticatedClient(
        base_url=server.url, token=registered.session_token, raise_on_unexpected_status=True
    )
    reply = generated("api.agent.post_api_v1_agent_heartbeat").sync(
        client=node, x_fleet_protocol="1", body=models.Heartbeat.from_dict({})
    )
    assert reply.status == "ready"

    nodes = generated("api.nodes.get_api_v1_nodes").sync(client=api)
    assert [(n.id, n.hostname, [g.model for g in n.gpus]) for n in nodes.items] == [
        (registered.node_id, "gen-host", ["NVIDIA L4"])
    ]

    created = generated("api.instances.post_api_v1_instances").sync(
        client=api,
        body=models.InstanceSpec.from_dict(
            {
                "name": "notebook",
                "command": ["sleep", "600"],
                "resources": {"gpus": 1},
                "ports": [{"port": 8888, "protocol": "http"}],
                "volume_bytes": 1 << 30,
            }
        ),
    )
    read = generated("api.instances.get_api_v1_instances_instance_id").sync(created.id, client=api)
    assert isinstance(read, models.Instance)
    assert (read.name, read.spec.to_dict()["ports"], read.spec.to_dict()["volume_bytes"]) == (
        "notebook",
        [{"port": 8888, "protocol": "http"}],
        1 << 30,
    )
    page = generated("api.instances.get_api_v1_instances").sync(client=api)
    assert isinstance(page, models.InstancePage) and [i.id for i in page.items] == [created.id]

    job = generated("api.jobs.post_api_v1_jobs").sync(
        client=api,
        body=models.JobSpec.from_dict(
            {"name": "train", "command": ["true"], "resources": {"gpus": 0}}
        ),
    )
    again = generated("api.jobs.get_api_v1_jobs_job_id").sync(job.id, client=api)
    assert (again.id, again.name, again.spec.to_dict()["command"]) == (job.id, "train", ["true"])
    assert (
        json.loads(json.dumps(again.to_dict()))["owner"] == again.owner
    )  # the model round-trips as JSON
