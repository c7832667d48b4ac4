"""The messages of the agent wire read back equal from what their own side built (fleetwire)."""

import dataclasses
import json

import pytest

from fleetwire.assignment import AssignedInstance, Assignment
from fleetwire.finish import FinishResult, TaskFinish
from fleetwire.heartbeat import Heartbeat, HeartbeatReply, TaskReport
from fleetwire.output import OutputBatch
from fleetwire.registration import Registered, Registration, Resources
from fleetwire.tasks import (
    Acquire,
    AcquireReply,
    LogBatch,
    Rendezvous,
    RendezvousPublish,
    TaskRestarting,
    TaskStarted,
    ValidationReport,
)


def _assignment(**changes):
    fields = dict(
        task_id="t-1",
        job_id="j-1",
        epoch=3,
        attempt=2,
        rank=1,
        num_nodes=2,
        command=["python", "-c", "1"],
        env={"A": "1"},
        workdir="src",
        gpus=[{"uuid": "GPU-1", "memory_limit_bytes": 1 << 30}],
        isolation="shared",
        max_runtime_seconds=60.0,
        artifacts=[{"sha256": "a" * 64, "path": "x"}],
        priority_class="spot",
        bid=1.5,
        cpus=2.0,
        memory_bytes=1 << 30,
        memory_default=False,
        pids=64,
        task_path="/usr/bin:/bin",
        run_as={"source": "dynamic", "user": None, "uid": 61184, "gid": 61184},
    )
    return Assignment(**dict(fields, **changes))


@pytest.mark.parametrize(
    "instance",
    [
        None,
        AssignedInstance(
            id="i-1",
            name="web",
            restart="always",
            ports=((8000, "http"), (22, "tcp")),
            volume_bytes=1 << 30,
            volume_mount_path="/workspace",
            image="localhost/app:1",
            idle_below_percent=5.0,
            idle_for_seconds=600.0,
            scratch_bytes=1 << 20,
            runtime_args=("--init", "--shm-size=1g"),
        ),
    ],
)
def test_an_assignment_reads_back_equal_from_its_wire_form(instance):
    sent = _assignment(instance=instance, command=[] if instance else ["python", "-c", "1"])
    assert Assignment.from_wire(sent.to_wire()) == sent


def test_an_assignment_of_an_older_fleetd_without_attempt_is_its_first():
    wire = _assignment().to_wire()
    del wire["attempt"]
    assert Assignment.from_wire(wire).attempt == 1
    with pytest.raises(ValueError, match="attempt"):
        Assignment.from_wire(dict(wire, attempt=0))


def test_a_heartbeat_and_its_answer_read_back_equal_from_their_wire_forms():
    beat = Heartbeat(
        tasks=(TaskReport("t-1", 2, "running"),),
        metrics={"gpus": []},
        volumes=("i-1",),
        instances=({"task_id": "t-1", "epoch": 2},),
        gpus=({"uuid": "GPU-1", "index": 0},),
        capabilities={"containers": "ready"},
        draining=True,
        agent_version="0.1.3",
        bundle_sha256="",
        labels={"rack": "a"},
    )
    assert Heartbeat.from_wire(beat.to_wire()) == beat
    assert Heartbeat.from_wire(Heartbeat().to_wire()) == Heartbeat() == Heartbeat.from_wire({})
    reply = HeartbeatReply(
        status="ready",
        heartbeat_interval_seconds=10,
        cancel=("t-9",),
        delete_volumes=("i-2",),
        lease_seconds=40.0,
        validation={"id": "v-1", "suite": []},
        drain=None,
    )
    assert HeartbeatReply.from_wire(reply.to_wire()) == reply
    revoked = HeartbeatReply(
        status="revoked", heartbeat_interval_seconds=10, revoked=True, cancel=("t-1",)
    )
    assert HeartbeatReply.from_wire(revoked.to_wire()) == revoked


@pytest.mark.parametrize(
    "body, field",
    [
        ({"tasks": [{"id": "t", "epoch": "1", "state": "running"}]}, "tasks"),
        ({"volumes": "i-1"}, "volumes"),
        ({"draining": "yes"}, "draining"),
        ({"gpus": [1]}, "gpus"),
    ],
)
def test_a_heartbeat_of_the_wrong_shape_is_refused_by_name(body, field):
    with pytest.raises(ValueError, match=field):
        Heartbeat.from_wire(body)


def test_fleetds_heartbeat_schemas_name_exactly_the_wires_fields():
    from fleetd.schemas.agent import HeartbeatReplySchema, HeartbeatSchema

    assert set(HeartbeatSchema().fields) == {f.name for f in dataclasses.fields(Heartbeat)}
    assert set(HeartbeatReplySchema().fields) == {
        f.name for f in dataclasses.fields(HeartbeatReply)
    }


def test_a_registration_and_its_answer_read_back_equal_from_their_wire_forms():
    reg = Registration(
        hostname="gpu-1",
        machine_id="m-1",
        agent_version="0.1.3",
        address="10.0.0.5",
        resources=Resources(cpu_count=64, memory_bytes=1 << 40, container_runtime="podman"),
        gpus=(
            {"uuid": "GPU-1", "index": 0, "model": "NVIDIA H100", "memory_total_bytes": 1 << 30},
        ),
        labels={"rack": "a"},
        capabilities={"containers": "ready"},
    )
    assert Registration.from_wire(reg.to_wire()) == reg
    answer = Registered(
        node_id="n-1", fleet="lab", session_token="fln_x", heartbeat_interval_seconds=10
    )
    assert Registered.from_wire(answer.to_wire()) == answer
    with pytest.raises(ValueError, match="resources"):
        Registration.from_wire(dict(reg.to_wire(), resources=None))


def test_fleetds_registration_schemas_name_exactly_the_wires_fields():
    from fleetd.schemas.agent import RegisteredSchema, RegisterSchema, ReportedResourcesSchema

    assert set(RegisterSchema().fields) == {f.name for f in dataclasses.fields(Registration)}
    assert set(ReportedResourcesSchema().fields) == {f.name for f in dataclasses.fields(Resources)}
    assert set(RegisteredSchema().fields) == {f.name for f in dataclasses.fields(Registered)}


def test_a_finish_report_and_a_batchs_result_read_back_equal_from_their_wire_forms():
    plain = TaskFinish(epoch=2, outcome="succeeded", exit_code=0)
    assert plain.to_wire() == {
        "epoch": 2,
        "outcome": "succeeded",
        "exit_code": 0,
    }  # an older fleetd reads it
    full = TaskFinish(
        epoch=3,
        outcome="failed",
        exit_code=-9,
        reason="killed",
        lost=True,
        agent_stopping=True,
        pid=4242,
        started_seconds_ago=0.25,
        idle=True,
        ports=({"port": 8000, "host_port": 41000},),
    )
    for finish in (plain, full):
        assert TaskFinish.from_wire(finish.to_wire()) == finish
    for result in (
        FinishResult("t-1", 204),
        FinishResult("t-2", 409, {"code": "conflict", "message": "stale"}),
    ):
        assert FinishResult.from_wire(result.to_wire()) == result
    with pytest.raises(ValueError, match="outcome"):
        TaskFinish.from_wire({"epoch": 1, "outcome": "exploded"})


def test_fleetds_finish_schemas_name_exactly_the_wires_fields():
    from fleetd.schemas.jobs import TaskFinishItemSchema, TaskFinishResultSchema, TaskFinishSchema

    assert set(TaskFinishSchema().fields) == {f.name for f in dataclasses.fields(TaskFinish)}
    assert set(TaskFinishItemSchema().fields) == {
        f.name for f in dataclasses.fields(TaskFinish)
    } | {"task_id"}
    assert set(TaskFinishResultSchema().fields) == {
        f.name for f in dataclasses.fields(FinishResult)
    }


@pytest.mark.parametrize(
    "message",
    [
        Acquire(),
        Acquire(wait_seconds=5, max_assignments=16),
        AcquireReply(),
        AcquireReply(({"task_id": "t-1"},), ("t-2",), batched=True),
        AcquireReply(({"task_id": "t-1"},)),
        TaskStarted(epoch=1),
        TaskStarted(
            epoch=2,
            pid=77,
            ports=({"port": 8000, "host_port": 41000, "protocol": "http"},),
            restarts=3,
            started_seconds_ago=0.31,
        ),
        TaskRestarting(
            epoch=1, backoff_seconds=2.5, exit_code=1, signal=None, reason="exit code 1"
        ),
        RendezvousPublish(epoch=1, addr="10.0.0.5", port=29500),
        Rendezvous(addr="10.0.0.5", port=29500),
        LogBatch(epoch=1, lines=(["stdout", "hello"], ["stderr", "oops", 1])),
        ValidationReport(
            checks=({"name": "gpus_present", "gpu": None, "status": "passed", "detail": "8 GPUs"},),
            system={"driver_version": "550.54.15", "cuda_version": "12.4"},
        ),
    ],
)
def test_the_work_messages_read_back_equal_from_their_json_wire_forms(message):
    assert type(message).from_wire(json.loads(json.dumps(message.to_wire()))) == message


def test_fleetds_work_schemas_name_exactly_the_wires_fields():
    from fleetd.schemas import jobs
    from fleetd.schemas.validation import ValidationReportSchema

    for schema, message in (
        (jobs.AcquireSchema, Acquire),
        (jobs.TaskStartSchema, TaskStarted),
        (jobs.TaskRestartSchema, TaskRestarting),
        (jobs.RendezvousPublishSchema, RendezvousPublish),
        (jobs.RendezvousSchema, Rendezvous),
        (ValidationReportSchema, ValidationReport),
    ):
        assert set(schema().fields) == {f.name for f in dataclasses.fields(message)}, schema
    # The logs route takes an OutputBatch, or the LogBatch of an agent from before it.
    assert set(jobs.LogBatchSchema().fields) == {
        f.name for f in dataclasses.fields(OutputBatch)
    } | {f.name for f in dataclasses.fields(LogBatch)}
    assert set(jobs.AcquireReplySchema().fields) == {
        "assignment",
        "assignments",
        "cancel",
        "flush_output",
    }  # batched: which is sent
