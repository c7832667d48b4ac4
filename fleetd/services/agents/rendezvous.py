"""Rendezvous of a gang's ranks: rank 0 publishes its address, the others wait for it; a rank that
arrives after rank 0 ended is told the gang is over."""

from fleetd.db import released, write_transaction
from fleetd.errors import Conflict, NotFound, Timeout
from fleetd.models import (
    Node,
    Task,
    TaskState,
)
from fleetd.services.agents.work import after_task_end, leased_task
from fleetd.services.workloads.lifecycle import ACTIVE_TASK_STATES
from fleetd.services.workloads.runs import end_task


def publish_rendezvous(rt, node_id, task_id, epoch, addr, port):
    """Rank 0 says where the other ranks find it."""
    with write_transaction():
        task = leased_task(node_id, task_id, epoch)
        if task.rank != 0:
            raise Conflict("only rank 0 publishes the rendezvous", {"rank": task.rank})
        if not TaskState(task.state).is_active():
            raise Conflict(f"task {task_id} is {task.state}", {"state": task.state})
        task.rendezvous_addr, task.rendezvous_port = addr, port
        task.save()
    rt.notifier.notify(("rendezvous", task.job_id))


def wait_rendezvous(rt, node_id, task_id, wait_seconds):
    """Rank 0's address and port for this task's job, once every rank of the attempt has arrived;
    Timeout if that does not happen in time.

    The start barrier of a gang: a rank's first call records that it arrived (rank 0 arrives by
    publishing), and no rank learns the address, so no rank's command starts, before all ranks of
    the attempt are placed and here. Rank 0 asks too, after publishing, and so waits for the others.
    """
    task = Task.get_or_none_by_id(task_id)
    if task is None or task.node_id != node_id:
        raise NotFound(f"task {task_id} not found on this node")
    job_id, epoch = task.job_id, task.epoch
    wait_seconds = min(wait_seconds, rt.settings.long_poll_max_seconds)
    if task.rank != 0 and task.rendezvous_addr is None:
        _arrive(rt, node_id, task_id, epoch)

    def published():
        current = Task.get_or_none_by_id(task_id)
        if current is None or current.epoch != epoch or not TaskState(current.state).is_active():
            raise Conflict(
                f"task {task_id} is no longer leased at epoch {epoch}", {"task_id": task_id}
            )
        ranks = list(
            Task.select(Task.rank, Task.state, Task.rendezvous_addr, Task.rendezvous_port).where(
                Task.job == job_id
            )
        )
        rank0 = next((r for r in ranks if r.rank == 0), None)
        met = (
            rank0 is not None
            and rank0.rendezvous_port is not None
            and all(r.rendezvous_addr is not None for r in ranks)
        )
        if rank0 is not None and rank0.state == TaskState.SUCCEEDED.value:
            # Every rank had arrived: the gang started together, and rank 0 was simply quick (this
            # rank's answer came between two of its polls). Otherwise it ran to its end without this
            # rank: they can never meet.
            return (
                {"addr": rank0.rendezvous_addr, "port": rank0.rendezvous_port} if met else GANG_OVER
            )
        if rank0 is None or not met or not all(TaskState(r.state).is_active() for r in ranks):
            # Rank 0 has not published, or a rank is not placed or not here yet: nobody starts.
            return None
        return {"addr": rank0.rendezvous_addr, "port": rank0.rendezvous_port}

    found = released(published) or rt.notifier.wait(
        ("rendezvous", job_id), wait_seconds, lambda: released(published)
    )
    if found == GANG_OVER:
        _end_unmet_rank(rt, node_id, task_id, epoch)
    if not found:
        raise Timeout(
            f"the ranks of job {job_id} have not all arrived at the rendezvous within "
            f"{wait_seconds}s"
        )
    return found


def _arrive(rt, node_id, task_id, epoch):
    """A rank > 0 is at the rendezvous: recorded (its node's address) so that the others may
    start."""
    with write_transaction():
        task = leased_task(node_id, task_id, epoch)
        rank0 = Task.get_or_none((Task.job == task.job_id) & (Task.rank == 0))
        late = (
            rank0 is not None and rank0.state == TaskState.SUCCEEDED.value
        )  # an arrival after the end is none
        if task.rendezvous_addr is None and task.state in ACTIVE_TASK_STATES and not late:
            node = Node.get_or_none_by_id(node_id)
            task.rendezvous_addr = (node.address if node is not None else None) or "arrived"
            task.save()
    rt.notifier.notify(("rendezvous", task.job_id))


GANG_OVER = {"gang_over": True}  # published()'s answer when rank 0 ended before this rank joined


def _end_unmet_rank(rt, node_id, task_id, epoch):
    """A rank still waiting for the rendezvous after rank 0 ran to its end: the gang's ranks did not
    start together, so this attempt is over (the job retries as a whole or fails, per its policy).
    The rank is ended here rather than left to wait out its rendezvous timeout holding its GPUs; the
    node is told 409, which stops the rank's preparation (no process of it started)."""
    now = rt.clock.now()
    with write_transaction():
        task = Task.get_or_none_by_id(task_id)
        if (
            task is not None
            and task.node_id == node_id
            and task.epoch == epoch
            and task.state in ACTIVE_TASK_STATES
        ):
            end_task(
                rt,
                task,
                TaskState.FAILED,
                f"rank {task.rank} never met rank 0 at the rendezvous: rank 0 had "
                "already run to its end, so the gang did not start together",
                now,
                reported=True,
            )
    after_task_end(rt, task.job_id if task is not None else None, node_id)
    raise Conflict(
        f"task {task_id}: rank 0 of its job ran to its end before this rank joined; the attempt is "
        f"over",
        {"task_id": task_id, "reason": "gang_not_met"},
    )
