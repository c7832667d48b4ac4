"""Typed specs: made by the schemas, stored as their JSON form and read back equal; group keys
computed from named fields, stable across processes and code changes."""

import dataclasses

import pytest
from marshmallow import ValidationError

from fleetd import scheduler
from fleetd.errors import InvalidRequest
from fleetd.schemas.instances import InstanceSpecSchema
from fleetd.schemas.jobs import JobSpecSchema
from fleetd.services.placement.terms import group_key_of, task_request
from fleetd.specs import (
    DEFAULT_RETRY,
    NO_RETRY,
    InstanceSpec,
    JobSpec,
    Port,
    Resources,
    group_key,
    group_of,
)

TRAIN = {
    "name": "train",
    "command": ["python", "t.py"],
    "resources": {"gpus": 2, "gpu_types": ["NVIDIA H100 80GB HBM3"]},
    "node_selector": {"fleet": "a", "labels": {"zone": "x"}},
    "priority_class": "spot",
    "bid": 1.5,
}


def test_the_job_schema_makes_a_typed_spec_that_survives_storage():
    spec = JobSpecSchema().load(
        dict(
            TRAIN,
            env={"A": "1"},
            retry={"max_attempts": 2, "on": ["failed"]},
            artifacts=[{"sha256": "a" * 64, "path": "data/x"}],
        )
    )
    assert isinstance(spec, JobSpec)
    assert (
        spec.command == ("python", "t.py")
        and spec.resources.gpus == 2
        and spec.node_selector.fleet == "a"
    )
    assert spec.retry_policy.max_attempts == 2 and spec.artifacts[0].path == "data/x"
    assert JobSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"


def test_a_job_without_a_retry_rule_gets_the_default():
    spec = JobSpecSchema().load({"name": "x", "command": ["true"]})
    assert spec.retry is None and spec.retry_policy == DEFAULT_RETRY
    assert spec.to_dict()["retry"] is None  # shown as submitted


def test_the_instance_schema_makes_a_typed_spec_and_each_run_is_a_job_spec_held_to_its_node():
    spec = InstanceSpecSchema().load(
        {
            "name": "web",
            "image": "localhost/app:1",
            "ports": [{"port": 8000}],
            "resources": {"gpus": 1},
            "volume_bytes": 1 << 30,
        }
    )
    assert isinstance(spec, InstanceSpec) and spec.ports == (Port(8000, "http"),)
    assert InstanceSpec.from_dict(spec.to_dict()) == spec
    run = spec.run("node-1")
    assert (
        run.node_selector.node_id == "node-1" and run.node_selector.container
    )  # an image needs a runtime
    assert (
        run.retry == NO_RETRY
        and run.instance.volume_bytes == 1 << 30
        and run.instance.image == "localhost/app:1"
    )
    assert JobSpec.from_dict(run.to_dict()) == run
    assert spec.run(None).node_selector.node_id is None


def test_a_group_key_is_a_fixed_function_of_named_fields():
    spec = JobSpec.from_dict(TRAIN)
    key = group_key(group_of(spec.task_request(), "ml", "spot", 1.5))
    # A stored key must not change with the code: this value changes only with GROUP_KEY_VERSION.
    assert key == "21ed0725b3e6b06aa34b"
    assert (
        group_key_of(dataclasses.replace(spec, name="other", command=("x",)), "ml", "spot") == key
    )
    assert group_key_of(spec, "other-team", "spot") != key
    assert group_key_of(dataclasses.replace(spec, bid=2.0), "ml", "spot") != key
    assert group_of(spec.task_request(), "ml", "spot", 1.5).fleet == "a"


def test_topology_survives_storage_reaches_the_engine_and_splits_groups():
    spec = JobSpecSchema().load(dict(TRAIN, resources={"gpus": 2, "topology": "required"}))
    assert spec.resources.topology == "required"
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert spec.task_request().topology == scheduler.TOPOLOGY_REQUIRED
    plain = JobSpecSchema().load(TRAIN)
    assert "topology" not in plain.to_dict()["resources"]  # specs stored before read as before
    assert plain.task_request().topology == scheduler.TOPOLOGY_PREFERRED
    assert group_key_of(spec, "ml", "spot") != group_key_of(plain, "ml", "spot")
    body = {"name": "nb", "command": ["x"], "resources": {"gpus": 2, "topology": "required"}}
    instance = InstanceSpecSchema().load(body)
    assert InstanceSpec.from_dict(instance.to_dict()) == instance
    assert instance.run(None).task_request().topology == scheduler.TOPOLOGY_REQUIRED


def test_same_block_survives_storage_reaches_the_engine_and_splits_groups():
    body = dict(TRAIN, num_nodes=4, network={"same_block": "required"})
    spec = JobSpecSchema().load(body)
    assert spec.same_block == "required"
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["network"] == {"same_block": "required"}
    assert spec.task_request().same_block == scheduler.TOPOLOGY_REQUIRED
    plain = JobSpecSchema().load(dict(TRAIN, num_nodes=4))
    assert "network" not in plain.to_dict()  # specs stored before read as before
    assert plain.task_request().same_block == scheduler.TOPOLOGY_PREFERRED
    assert group_key_of(spec, "ml", "spot") != group_key_of(plain, "ml", "spot")
    with pytest.raises(ValidationError):
        JobSpecSchema().load(dict(body, network={"same_block": "always"}))


def test_a_request_the_engine_cannot_evaluate_is_refused_not_stored_without_a_key():
    spec = JobSpec(
        name="x", command=("true",), resources=Resources(gpus=2, gpu_memory_bytes=1 << 30)
    )
    with pytest.raises(InvalidRequest):
        task_request(spec)
    with pytest.raises(InvalidRequest):
        group_key_of(spec, None, "on-demand")
    assert isinstance(task_request(JobSpec.from_dict(TRAIN)), scheduler.TaskRequest)
