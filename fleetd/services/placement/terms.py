"""What a job asks of capacity: its spec as the engine's TaskRequest, its JobTerms (fixed at
submit, kept per job id) and the key of its group (jobs that get the same answer)."""

import dataclasses
import itertools
import threading
import typing

from fleetd import scheduler
from fleetd.errors import InvalidRequest
from fleetd.models import Job
from fleetd.specs import Group, JobSpec, group_key, group_of


def task_request(spec: JobSpec, owner: str = "", account: str = "") -> scheduler.TaskRequest:
    """The engine's TaskRequest for a JobSpec of this owner (a user's or a service account's id;
    `account`: its login, where some fleet runs tasks as their owners' own accounts);
    InvalidRequest when the engine cannot evaluate it."""
    try:
        request = spec.task_request(owner, account)
        scheduler.shape_of(request)
    except ValueError as exc:
        raise InvalidRequest(f"resources: {exc}", {"fields": {"resources": [str(exc)]}}) from None
    return request


class Workload(typing.NamedTuple):
    """A job, or the instance whose run a job is: how every surface names what holds capacity."""

    kind: str  # "job" or "instance"
    id: str
    name: str

    def as_dict(self):
        return {"kind": self.kind, "id": self.id, "name": self.name}


@dataclasses.dataclass(frozen=True)
class JobTerms:
    """What capacity needs of a job: fixed at submit, so read once per job and kept."""

    request: scheduler.TaskRequest
    team: str
    priority_class: str
    bid: float | None
    group: (
        Group  # jobs with equal groups get the same answer from the scheduling rules and the engine
    )
    workload: Workload  # what the job is to its users: itself, or a run of an instance


def _terms(spec: JobSpec, team, priority_class, workload, owner, account="") -> JobTerms:
    request = task_request(spec, owner, account)
    return JobTerms(
        request,
        team or "",
        priority_class,
        spec.bid,
        group_of(request, team, priority_class, spec.bid),
        workload,
    )


def workload_of(job_id, name, instance_id):
    """The Workload of a job row: the instance it runs, or the job itself."""
    return (
        Workload("instance", instance_id, name)
        if instance_id is not None
        else Workload("job", job_id, name)
    )


def group_key_of(spec: JobSpec, team, priority_class, owner="", account="") -> str:
    """The group key of a job about to be stored; InvalidRequest when the engine cannot evaluate
    it."""
    return group_key(group_of(task_request(spec, owner, account), team, priority_class, spec.bid))


class TermsCache:
    """JobTerms by job id. A job's spec, team and class never change after submit and job ids are
    never reused, so an entry never goes stale; the oldest entries go beyond `size`. One per
    Runtime (rt.terms).

    The size holds a queue of 100,000 jobs and the jobs of the tasks that run beside it, at about
    1 KiB an entry: a cache smaller than what a pass reads (every queued job after a start, before
    the groups are parked again) is emptied by each pass, which then parses every spec anew
    (bench/queue_depth.py: passes of several seconds at 50,000)."""

    def __init__(self, size=250_000):
        self.size = size
        # True while some fleet runs tasks as their owners' own accounts: a job's request then
        # names its owner's login (services.nodes.accounts). Terms made before a fleet turned to
        # that keep what they were.
        self.accounts: typing.Callable[[], bool] = lambda: False
        self._terms = {}
        self._lock = threading.Lock()

    def get_many(self, job_ids):
        with self._lock:
            found = {j: self._terms[j] for j in job_ids if j in self._terms}
        missing = [j for j in job_ids if j not in found]
        for start in range(0, len(missing), 500):  # bounded IN lists
            rows = (
                Job.select(
                    Job.id,
                    Job.spec,
                    Job.team,
                    Job.priority_class,
                    Job.name,
                    Job.instance_id,
                    Job.owner_token_id,
                    Job.user,
                )
                .where(Job.id.in_(missing[start : start + 500]))
                .tuples()
                .execute()
            )
            accounts = self.accounts()
            for job_id, spec, team, priority_class, name, instance_id, owner, login in rows:
                found[job_id] = _terms(
                    JobSpec.from_dict(spec),
                    team,
                    priority_class,
                    workload_of(job_id, name, instance_id),
                    owner,
                    (login or "") if accounts else "",
                )
        with self._lock:
            for job_id in missing:
                if job_id in found:
                    self._terms[job_id] = found[job_id]
            self._evict()
        return found

    def _evict(self):
        """Drop the oldest entries beyond `size` (call with the lock held)."""
        excess = len(self._terms) - self.size
        if excess > 0:
            for stale in list(itertools.islice(self._terms, excess)):
                del self._terms[stale]

    def get_each(self, job_ids):
        """({id: JobTerms}, {id: exception}): get_many, except that a job whose spec cannot be
        evaluated is left out with why instead of failing the others."""
        try:
            return self.get_many(job_ids), {}
        except Exception:  # one spec is bad: find it, keep the rest
            found, failed = {}, {}
            for job_id in job_ids:
                try:
                    found.update(self.get_many([job_id]))
                except Exception as exc:
                    failed[job_id] = exc
            return found, failed
