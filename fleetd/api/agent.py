"""The agent protocol (X-Fleet-Protocol: 1): the node's session (register, heartbeat, deregister)
and its work (acquire, start, restart, rendezvous, logs, finish); the messages are fleetwire's."""

from flask import request
from flask.views import MethodView

from fleetd.api.parser import Blueprint
from fleetd.auth import JOIN, NODE, current_principal, require
from fleetd.errors import InvalidRequest, PayloadTooLarge
from fleetd.runtime import current_runtime
from fleetd.schemas.agent import (
    HeartbeatReplySchema,
    HeartbeatSchema,
    RegisteredSchema,
    RegisterSchema,
)
from fleetd.schemas.jobs import (
    AcquireReplySchema,
    AcquireSchema,
    ChunkQuerySchema,
    LogBatchSchema,
    RendezvousPublishSchema,
    RendezvousQuerySchema,
    RendezvousSchema,
    TaskFinishBatchReplySchema,
    TaskFinishBatchSchema,
    TaskFinishSchema,
    TaskRestartSchema,
    TaskStartSchema,
)
from fleetd.services.agents import rendezvous, work
from fleetd.services.agents import sessions as agents
from fleetd.services.workloads import output
from fleetwire.output import MAX_CHUNK_UPLOAD_BYTES, ChunkMeta
from fleetwire.tasks import AcquireReply

blp = Blueprint(
    "agent",
    __name__,
    url_prefix="/api/v1/agent",
    description="Agent protocol; needs X-Fleet-Protocol: 1",
)

PROTOCOL_HEADER = "X-Fleet-Protocol"
PROTOCOL_VERSION = "1"
PROTOCOL_PARAMETER = {
    "in": "header",
    "name": PROTOCOL_HEADER,
    "required": True,
    "schema": {"type": "string", "enum": [PROTOCOL_VERSION]},
    "description": "the agent protocol version; another value or none gets 400 protocol_mismatch",
}


@blp.route("/register", parameters=[PROTOCOL_PARAMETER])
class AgentRegister(MethodView):
    @require(JOIN)
    @blp.arguments(RegisterSchema())
    @blp.response(201, RegisteredSchema)
    def post(self, body):
        """Enrol a host with a join token; returns its node id and session token."""
        rt = current_runtime()
        return agents.register_node(rt, current_principal().id, body).to_wire()


@blp.route("/heartbeat", parameters=[PROTOCOL_PARAMETER])
class AgentHeartbeat(MethodView):
    @require(NODE)
    @blp.arguments(HeartbeatSchema(), required=False)
    @blp.response(200, HeartbeatReplySchema)
    def post(self, body):
        """Report liveness, inventory changes and tasks; learn drain, revocation and tasks to
        cancel."""
        rt = current_runtime()
        rt.instruments.heartbeats.inc()
        return agents.heartbeat(rt, current_principal().node, body).to_wire()


@blp.route("/deregister", parameters=[PROTOCOL_PARAMETER])
class AgentDeregister(MethodView):
    @require(NODE)
    @blp.response(204)
    def post(self):
        """Leave gracefully: the session ends and the node is marked lost at once."""
        agents.deregister_node(current_runtime(), current_principal().node_id)


@blp.route("/acquire", parameters=[PROTOCOL_PARAMETER])
class AgentAcquire(MethodView):
    @require(NODE)
    @blp.arguments(AcquireSchema(), required=False)
    @blp.response(200, AcquireReplySchema)
    def post(self, body):
        """Long-poll for work: answers as soon as an assignment exists or a task of this node must
        be stopped (`cancel`), or after wait_seconds with null."""
        batch = body.max_assignments
        found = work.acquire(
            current_runtime(), current_principal().node_id, body.wait_seconds, batch or 1
        )
        return AcquireReply(
            tuple(found["assignments"]),
            tuple(found["cancel"]),
            batched=batch is not None,
            flush_output=tuple(found.get("flush_output", ())),
        ).to_wire()


@blp.route("/tasks/<string:task_id>/start", parameters=[PROTOCOL_PARAMETER])
class AgentTaskStart(MethodView):
    @require(NODE)
    @blp.arguments(TaskStartSchema())
    @blp.response(204)
    def post(self, body, task_id):
        """The task's process started; a stale epoch gets 409."""
        work.start_task(
            current_runtime(),
            current_principal().node_id,
            task_id,
            body.epoch,
            body.pid,
            None if body.ports is None else list(body.ports),
            body.restarts,
            body.started_seconds_ago,
        )


@blp.route("/tasks/<string:task_id>/restart", parameters=[PROTOCOL_PARAMETER])
class AgentTaskRestart(MethodView):
    @require(NODE)
    @blp.arguments(TaskRestartSchema())
    @blp.response(204)
    def post(self, body, task_id):
        """An instance run's process ended and its restart policy starts it again after a back-off;
        a stale epoch gets 409."""
        work.restart_task(
            current_runtime(),
            current_principal().node_id,
            task_id,
            body.epoch,
            {
                "exit_code": body.exit_code,
                "signal": body.signal,
                "reason": body.reason,
                "backoff_seconds": body.backoff_seconds,
            },
        )


@blp.route("/tasks/<string:task_id>/rendezvous", parameters=[PROTOCOL_PARAMETER])
class AgentTaskRendezvous(MethodView):
    @require(NODE)
    @blp.arguments(RendezvousPublishSchema())
    @blp.response(204)
    def post(self, body, task_id):
        """Rank 0 publishes the address and port the other ranks connect to."""
        rendezvous.publish_rendezvous(
            current_runtime(),
            current_principal().node_id,
            task_id,
            body.epoch,
            body.addr,
            body.port,
        )

    @require(NODE)
    @blp.arguments(RendezvousQuerySchema(), location="query")
    @blp.response(200, RendezvousSchema)
    def get(self, query, task_id):
        """Rank 0's address and port; 504 if it is not published within wait_seconds."""
        return rendezvous.wait_rendezvous(
            current_runtime(), current_principal().node_id, task_id, query["wait_seconds"]
        )


@blp.route("/tasks/<string:task_id>/logs", parameters=[PROTOCOL_PARAMETER])
class AgentTaskLogs(MethodView):
    @require(NODE)
    @blp.arguments(LogBatchSchema())
    @blp.response(204)
    def post(self, body, task_id):
        """A batch of output lines; 413 over the request size limit."""
        work.append_logs(current_runtime(), current_principal().node_id, task_id, body)


def _chunk_meta(first_line, query):
    if not first_line.isdigit() or len(first_line) > 18:
        raise InvalidRequest("first_line must be a line number (0 or more)")
    try:
        return ChunkMeta.from_query(int(first_line), query)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc


@blp.route("/tasks/<string:task_id>/output/<string:first_line>", parameters=[PROTOCOL_PARAMETER])
class AgentTaskOutputChunk(MethodView):
    @require(NODE)
    @blp.arguments(ChunkQuerySchema(), location="query")
    @blp.doc(
        requestBody={
            "required": True,
            "description": "the chunk's gzip bytes (sent as application/gzip)",
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    )
    @blp.response(204)
    def put(self, meta, task_id, first_line):
        """A chunk of the task's output (gzip of frames) for the output store; one stored before is
        not written again."""
        request.max_content_length = MAX_CHUNK_UPLOAD_BYTES
        if (request.content_length or 0) > MAX_CHUNK_UPLOAD_BYTES:
            raise PayloadTooLarge(f"a chunk is at most {MAX_CHUNK_UPLOAD_BYTES} bytes")
        output.store_chunk(
            current_runtime(),
            current_principal().node_id,
            task_id,
            _chunk_meta(first_line, meta),
            request.get_data(cache=False),
        )


@blp.route("/tasks/<string:task_id>/finish", parameters=[PROTOCOL_PARAMETER])
class AgentTaskFinish(MethodView):
    @require(NODE)
    @blp.arguments(TaskFinishSchema())
    @blp.response(204)
    def post(self, body, task_id):
        """The task's process ended with this outcome."""
        work.finish_task(current_runtime(), current_principal().node_id, task_id, body)


@blp.route("/finish", parameters=[PROTOCOL_PARAMETER])
class AgentFinish(MethodView):
    @require(NODE)
    @blp.arguments(TaskFinishBatchSchema())
    @blp.response(200, TaskFinishBatchReplySchema)
    def post(self, body):
        """Several tasks' processes ended: each report is settled and answered on its own."""
        results = work.finish_tasks(
            current_runtime(), current_principal().node_id, body["finishes"]
        )
        return {"results": [result.to_wire() for result in results]}
