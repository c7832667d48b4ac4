"""`fleetd job why` says which network blocks and leaves a gang would get, or got, and why."""

from click.testing import CliRunner

from fleetd.cli import jobs

JOB_ID = "0123456789abcdef0123"
NOTE = "all 2 ranks in block b1 on 1 leaf switch(es) (b1-l0): the fewest blocks and leaves"


class FakeClient:
    """Answers the two calls `job why` makes with a queued gang and its simulation."""

    def __init__(self, job):
        self.job = job

    def get(self, path, **params):
        assert path == f"/api/v1/jobs/{JOB_ID}"
        return self.job

    def post(self, path, body):
        assert path == "/api/v1/cluster/simulate-schedule"
        ranks = [
            {"rank": r, "node_id": f"n{r}", "block": "b1", "leaf": "b1-l0", "network_note": NOTE}
            for r in range(2)
        ]
        return {"schedulable": True, "placement": ranks, "filter_detail": [], "error": None}


def _why(monkeypatch, job):
    monkeypatch.setattr("fleetd.cli.remote.credentials", lambda url, token: ("http://x", "t"))
    monkeypatch.setattr("fleetd.cli.remote.Client", lambda url, token: FakeClient(job))
    return CliRunner().invoke(jobs.job_why, [JOB_ID])


def test_a_queued_gang_shows_the_block_and_leaf_of_each_rank_and_why(monkeypatch):
    job = {"id": JOB_ID, "state": "queued", "pending_reason": "", "spec": {"name": "g"}}
    result = _why(monkeypatch, job)
    assert result.exit_code == 0, result.output
    assert "rank 0 on n0: block b1, leaf b1-l0" in result.output
    assert result.output.count(NOTE) == 1


def test_a_running_gang_shows_each_tasks_placement_reason(monkeypatch):
    reason = "placed on node n0 in block b1, leaf b1-l0; " + NOTE
    task = {"rank": 0, "node_id": "n0", "gpus": [], "reason": reason, "link_class": None}
    job = {"id": JOB_ID, "state": "running", "tasks": [task], "spec": {}}
    result = _why(monkeypatch, job)
    assert result.exit_code == 0, result.output
    assert f"rank 0: {reason}" in result.output
