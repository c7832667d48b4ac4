"""Placement engines kept between passes (fleetd.services.placement.engines): after any sequence of
events, restarts of fleetd among them, the engine a pass decides with holds exactly what one built
afresh from the tables would."""

import uuid

import hypothesis
import hypothesis.strategies as st

from fleetd import scheduler
from fleetd.services.placement.capacity import gpu_summary
from fleetd.services.placement.cluster import current_state
from tests.conftest import admin_client
from tests.support.examples import examples
from tests.support.gpus import gpus as gpu_list
from tests.support.http import ApiClient

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "register",
                "submit",
                "submit_other",
                "submit_any",
                "start",
                "finish",
                "cancel",
                "cordon",
                "uncordon",
                "drain",
                "undrain",
                "gpus",
                "sick",
                "silence",
                "heartbeat",
                "window",
                "revoke",
                "restart",
            ]
        ),
        st.integers(min_value=0, max_value=3),
    ),
    min_size=1,
    max_size=24,
)


def _checked(rt, seen):
    """Make every engine a pass gets be compared with a fresh one over the same state."""
    engine_for = rt.engines.engine

    def checked(state, requests, policy=None, profile=None):
        engine, nodes = engine_for(state, requests, policy, profile)
        rows = state.inventory.nodes if nodes is None else nodes
        fresh = scheduler.PlacementEngine(state.snapshot(rows), policy=policy, profile=profile)
        assert engine.snapshot() == fresh.snapshot()
        seen.append(engine)
        return engine, nodes

    rt.engines.engine = checked


class _Fleet:
    """A few nodes in two fleets driven through the API, as agents and an admin would."""

    def __init__(self, api, clock, restart=None):
        self.api, self.clock = api, clock
        self.restart = restart  # () -> a new app over the same database (fleetd restarted)
        api.create_fleet("gpu-a")
        api.create_fleet("gpu-b")
        self.joins = {
            "gpu-a": api.create_join_token("gpu-a", max_uses=100),
            "gpu-b": api.create_join_token("gpu-b", max_uses=100),
        }
        self.nodes = {}  # n -> (node id, session token)
        self.running = []  # (session, assignment)

    def play(self, ops):
        """Three nodes register, then the events happen in order."""
        for n in range(3):
            self.do("register", n)
        for op, n in ops:
            self.do(op, n)

    def do(self, op, n):
        api = self.api
        if op == "register":
            if n not in self.nodes:
                name = f"h{n}"
                fleet = "gpu-a" if n % 2 == 0 else "gpu-b"
                self.nodes[n] = api.ready_node(self.joins[fleet], name, gpu_count=n + 1)
        elif op.startswith("submit"):
            selector = {
                "submit": {"fleet": "gpu-a"},
                "submit_other": {"fleet": "gpu-b"},
                "submit_any": {},
            }[op]
            gpus = [1, 0.5, 2, 8][n]
            api.submit(resources={"gpus": gpus}, node_selector=selector)
        elif op == "start":  # every node starts what it was given
            for _, session in self.nodes.values():
                resp = api.post(
                    "/api/v1/agent/acquire", {"wait_seconds": 0}, token=session, agent=True
                )
                assignment = resp.get_json().get("assignment") if resp.status_code == 200 else None
                if assignment is not None and self._agent(
                    session,
                    f"tasks/{assignment['task_id']}/start",
                    epoch=assignment["epoch"],
                    pid=4242,
                ):
                    self.running.append((session, assignment))
        elif op == "restart":  # what fleetd keeps in memory starts empty; the tables stay
            if self.restart is not None:
                self.api = ApiClient(self.restart(), self.api.token)
        elif op == "finish":  # the n-th running task ends
            if self.running:
                session, assignment = self.running.pop(n % len(self.running))
                self._agent(
                    session,
                    f"tasks/{assignment['task_id']}/finish",
                    epoch=assignment["epoch"],
                    outcome="succeeded",
                    exit_code=0,
                )
        elif n in self.nodes:
            self._node_op(op, n)

    def _node_op(self, op, n):
        api = self.api
        node_id, session = self.nodes[n]
        if op == "cancel":
            jobs = api.get("/api/v1/jobs?state=queued").get_json()["items"]
            if jobs:
                api.post(f"/api/v1/jobs/{jobs[n % len(jobs)]['id']}/cancel")
        elif op == "gpus":
            self._agent(session, "heartbeat", tasks=[], gpus=gpu_list(n + 2))
        elif op == "sick":  # its first GPU reports unhealthy
            gpus = gpu_list(n + 1)
            gpus[0].update(healthy=False, health_reason="XID 79")
            self._agent(session, "heartbeat", tasks=[], gpus=gpus)
        elif op == "silence":
            self.clock.advance(31)  # the others' heartbeats are overdue; this one speaks
            self._agent(session, "heartbeat", tasks=[])
        elif op == "heartbeat":
            self._agent(session, "heartbeat", tasks=[])
        elif op == "window":
            api.patch(
                "/api/v1/fleets/gpu-b",
                {"availability": {"windows": [{"start": f"0{n}:00", "end": "01:00"}]}},
            )
        elif op == "drain":
            api.post(f"/api/v1/nodes/{node_id}/drain", {"reason": "r", "deadline_seconds": 3600})
        else:
            api.post(f"/api/v1/nodes/{node_id}/{op}")

    def _agent(self, session, path, **body):
        """An agent's call whose answer may be a refusal (a revoked node, a task already ended)."""
        resp = self.api.post(f"/api/v1/agent/{path}", body, token=session, agent=True)
        assert resp.status_code < 500, resp.get_json()
        return resp.status_code < 300


@hypothesis.settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(ops=OPS)
def test_a_kept_engine_holds_what_a_fresh_one_would_after_any_events(
    make_app, clock, tmp_path, ops
):
    data_dir = str(tmp_path / uuid.uuid4().hex)
    seen = []

    def start():
        app = make_app(data_dir=data_dir, failover_grace_seconds=0)
        _checked(app.extensions["fleetd"], seen)
        return app

    fleet = _Fleet(admin_client(start(), clock), clock, restart=start)
    fleet.play(ops)
    fleet.do("submit_any", 0)
    fleet.api.run_task("scheduling")  # a full pass, parked groups included
    assert seen  # passes did decide with an engine


def test_passes_bring_a_kept_engine_up_to_date_node_by_node(api, clock):
    rt = api.app.extensions["fleetd"]
    seen = []
    _checked(rt, seen)
    fleet = _Fleet(api, clock)
    for n in range(4):
        fleet.do("register", n)
    fleet.do("submit", 0)
    built = rt.engines.built
    for op, n in [
        ("submit", 0),
        ("start", 0),
        ("start", 2),
        ("submit", 1),
        ("finish", 0),
        ("submit", 0),
        ("cordon", 2),
        ("submit", 3),
        ("uncordon", 2),
        ("silence", 0),
        ("submit", 1),
    ]:
        fleet.do(op, n)
    assert rt.engines.built == built  # no node joined or left: the same engines, brought up to date
    assert rt.engines.refreshed > 0
    assert len(seen) >= 5


def _one_node_checked(api, clock):
    """(runtime, engines seen, fleet) with one node and a job for it; every engine checked."""
    rt = api.app.extensions["fleetd"]
    seen = []
    _checked(rt, seen)
    fleet = _Fleet(api, clock)
    fleet.do("register", 0)
    fleet.do("submit", 0)
    return rt, seen, fleet


def test_nodes_that_join_are_added_to_a_kept_engine_and_one_that_leaves_rebuilds_it(api, clock):
    rt, seen, fleet = _one_node_checked(api, clock)
    fleet.do("register", 1)  # gpu-b's first node
    fleet.do("submit_other", 0)  # another candidate set (fleet gpu-b): its own engine
    built = rt.engines.built
    fleet.do("submit", 0)
    fleet.do("submit_other", 0)
    assert rt.engines.built == built and rt.engines.extended == 0
    fleet.do("register", 3)  # a node of gpu-b joined: added at the end of gpu-b's engine
    fleet.do("submit_other", 0)
    assert rt.engines.built == built and rt.engines.extended >= 1
    fleet.do("revoke", 1)  # a node left: engines over its fleet are built again
    fleet.do("submit_other", 0)
    assert rt.engines.built > built
    assert seen  # each engine a pass decided with held what a fresh one would


def test_a_node_that_joins_among_the_others_rebuilds_the_engine(api, clock, monkeypatch):
    from fleetd.services.agents import sessions

    rt, seen, fleet = _one_node_checked(api, clock)
    built = rt.engines.built
    # Another replica's clock is behind: the node's id sorts before those the engine has.
    monkeypatch.setattr(sessions, "new_id", lambda: "000000000000" + uuid.uuid4().hex[:8])
    fleet.do("register", 2)
    fleet.do("submit", 0)
    assert rt.engines.built == built + 1 and rt.engines.extended == 0 and seen


def _summary_of_rows(rows):
    """The gpu part of cluster status, counted from the allocation view's rows (one per GPU)."""

    def counts(of):
        out = {"total": len(of), "used": 0, "free": 0, "blocked": 0}
        for row in of:
            out[row["state"]] += 1
        return out

    by_series, notes = {}, {}
    for row in rows:
        by_series.setdefault(row["series"], []).append(row)
        if row["state"] == "blocked":
            key = (row["blocked_code"], row["series"])
            notes[key] = notes.get(key, 0) + 1
    return counts(rows), {sid: (of[0]["model"], counts(of)) for sid, of in by_series.items()}, notes


@hypothesis.settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(ops=OPS)
def test_the_gpu_summary_counts_every_gpu_as_its_allocation_row_classifies_it(
    make_app, clock, tmp_path, ops
):
    app = make_app(data_dir=str(tmp_path / uuid.uuid4().hex), failover_grace_seconds=0)
    rt = app.extensions["fleetd"]
    fleet = _Fleet(admin_client(app, clock), clock)
    # gpu-b leaves faulty GPUs in service: they are blocked one by one, not by a cordon.
    assert (
        fleet.api.patch(
            "/api/v1/fleets/gpu-b", {"health_policy": {"cordon_on_gpu_fault": False}}
        ).status_code
        == 200
    )
    fleet.play(ops + [("sick", 1)])
    with app.app_context():
        state = current_state(rt)
        summary = gpu_summary(state, {})
        overall, series, notes = _summary_of_rows(state.gpu_rows())
    assert {k: summary[k] for k in ("total", "used", "free", "blocked")} == overall
    assert {
        s["id"]: (s["label"], {k: s[k] for k in ("total", "used", "free", "blocked")})
        for s in summary["series"]
    } == series
    assert {(n["code"], n["series"]): n["count"] for n in summary["blocked_notes"]} == notes


def test_a_pass_whose_jobs_could_never_fit_builds_no_engine(api, clock):
    rt = api.app.extensions["fleetd"]
    fleet = _Fleet(api, clock)
    fleet.do("register", 0)
    never = api.submit(resources={"gpus": 1, "gpu_types": ["NVIDIA B300"]})
    assert api.run_task("scheduling")["pending"] == 1
    assert rt.engines.built == 0  # every job waits for a node that could hold it: no engine
    assert api.job(never["id"])["pending_reason"].startswith("no enrolled node has GPUs")
    fleet.do("submit", 0)
    assert rt.engines.built == 1  # a job that fits needs one


def test_an_engine_that_cannot_be_built_fails_the_pass_not_its_jobs(api, clock, monkeypatch):
    from fleetd.db import database
    from fleetd.services.placement import scheduling

    rt = api.app.extensions["fleetd"]
    fleet = _Fleet(api, clock)
    fleet.do("register", 0)
    api.submit(resources={"gpus": 1}, node_selector={"fleet": "gpu-a"})  # takes h0's one GPU
    job = api.submit(resources={"gpus": 1}, node_selector={"fleet": "gpu-a"})  # waits for it
    assert api.job(job["id"])["state"] == "queued"

    def broken(*args, **kwargs):
        raise RuntimeError("no engine today")

    monkeypatch.setattr(rt.engines, "engine", broken)
    with api.app.app_context(), database.connection_context():
        try:
            scheduling.run_pass(rt)
        except RuntimeError as exc:
            assert str(exc) == "no engine today"
        else:
            raise AssertionError("the pass went on without an engine")
    assert "no engine today" not in (api.job(job["id"])["pending_reason"] or "")
