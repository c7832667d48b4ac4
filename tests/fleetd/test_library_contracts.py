"""The shortcuts fleetd takes past its libraries' public APIs give what the public APIs give.

- fleetd.sql: compiled statements (peewee's private `_returning`; model instances built from
  `__data__`, `_dirty`, `__rel__`) return the same rows and the same model instances as plain
  peewee, and BaseModel.save() writes what peewee's only_save_dirty save writes;
- fleetd.server.RequestHeaders accepts and refuses header blocks as gevent's parser
  (http.client.parse_headers) under the same limits, on generated blocks (Hypothesis).

The library versions these hold for are bounded in setup.cfg; a new major version must pass here.
"""

import datetime as dt
import http.client
import io

import peewee
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetd.db import bind, open_database, upgrade
from fleetd.models import Fleet, Gpu, Job, Node, Task
from fleetd.server import MAX_HEADERS, RequestHeaders
from fleetd.sql import Statement, by_pk
from tests.support.examples import examples

T0 = dt.datetime(2026, 12, 1, 3, 0, 0)


@pytest.fixture
def db(tmp_path):
    database = bind(open_database(f"sqlite:///{tmp_path}/contract.db"))
    upgrade(database)
    with database.connection_context():
        Fleet.create(name="gpu-a", created_at=T0, labels={"zone": "z1"})
        for i in range(3):
            Node.create(
                id=f"n{i}",
                fleet="gpu-a",
                machine_id=f"m{i}",
                hostname=f"h{i}",
                status="ready",
                registered_at=T0 + dt.timedelta(seconds=i),
                labels={"rack": str(i)},
                cpu_count=8 * i,
                last_heartbeat_at=None if i == 0 else T0,
            )
            Gpu.create(
                node=f"n{i}",
                uuid=f"GPU-{i}",
                index=0,
                model="H100",
                memory_total_bytes=80 << 30,
                healthy=i != 1,
                numa_node=None if i == 2 else i,
            )
        Job.create(
            id="j1",
            name="j",
            owner="o",
            owner_token_id="t",
            state="queued",
            spec={"command": ["x"]},
            submitted_at=T0,
        )
        Task.create(id="t1", job="j1", rank=0, state="pending", gpus=[{"uuid": "GPU-0"}])
        yield database
    database.close()


def _same(a, b):
    return type(a) is type(b) and a.__data__ == b.__data__


def test_a_compiled_select_returns_what_peewee_returns(db):
    statement = Statement(lambda v: Node.select().where(Node.fleet == v("fleet")).order_by(Node.id))
    plain = list(Node.select().where(Node.fleet == "gpu-a").order_by(Node.id))
    compiled = statement.rows(fleet="gpu-a")
    assert len(plain) == len(compiled) == 3 and all(_same(a, b) for a, b in zip(plain, compiled))
    assert compiled[1].labels == {"rack": "1"} and compiled[0].last_heartbeat_at is None
    assert (
        statement.raw_tuples(fleet="gpu-a")
        == db.execute(Node.select().where(Node.fleet == "gpu-a").order_by(Node.id)).fetchall()
    )
    narrow = Statement(
        lambda v: Gpu.select(Gpu.uuid, Gpu.healthy, Gpu.numa_node).where(Gpu.model == v("m"))
    )
    assert [(g.uuid, g.healthy, g.numa_node) for g in narrow.rows(m="H100")] == [
        (g.uuid, g.healthy, g.numa_node)
        for g in Gpu.select(Gpu.uuid, Gpu.healthy, Gpu.numa_node).where(Gpu.model == "H100")
    ]


def test_a_join_falls_back_to_peewee_and_by_pk_matches_get(db):
    joined = Statement(
        lambda v: (
            Task.select(Task.id, Job.state.alias("job_state"))
            .join(Job, on=(Task.job == Job.id))
            .where(Task.id == v("id"))
        )
    )
    assert [(t.id, t.job_state) for t in joined.rows(id="t1")] == [("t1", "queued")]
    for model, pk in ((Node, "n2"), (Task, "t1"), (Job, "j1"), (Fleet, "gpu-a")):
        assert _same(by_pk(model).first(pk=pk), model.get(model._meta.primary_key == pk))
    assert by_pk(Node).first(pk="none") is None


def test_save_writes_the_fields_assigned_as_only_save_dirty_does(db):
    node = Node.get_by_id("n1")
    other = Node.get_by_id("n1")
    node.status = "cordoned"
    other.hostname = "renamed"
    assert node.save() == 1 and other.save() == 1  # each writes its own column only
    fresh = Node.get_by_id("n1")
    assert (fresh.status, fresh.hostname) == ("cordoned", "renamed")
    assert node.save() == 0  # nothing assigned since: no statement

    class PeeweeNode(Node):  # peewee's own save, with only_save_dirty
        class Meta:
            table_name = "node"
            only_save_dirty = True

    plain = PeeweeNode.get(PeeweeNode.id == "n2")
    mine = Node.get_by_id("n0")
    plain.labels, mine.labels = {"k": "v"}, {"k": "v"}
    peewee.Model.save(plain)
    mine.save()
    assert Node.get_by_id("n2").labels == Node.get_by_id("n0").labels == {"k": "v"}
    created = Node(
        id="n9", fleet="gpu-a", machine_id="m9", hostname="h9", status="pending", registered_at=T0
    )
    created.save(force_insert=True)
    assert _same(Node.get_by_id("n9"), Node.get(Node.id == "n9"))


# Header blocks: names and values from a small alphabet that includes the troublesome characters.
NAME = st.text(alphabet="abcXYZ-_ :\t", min_size=0, max_size=12)
VALUE = st.text(alphabet="abc 123\t:;,=é", min_size=0, max_size=20)
LINE = st.one_of(
    st.tuples(NAME, VALUE).map(lambda nv: f"{nv[0]}:{nv[1]}"),
    st.tuples(NAME, VALUE).map(lambda nv: f"{nv[0]} : {nv[1]}"),
    VALUE.map(lambda v: f" {v}"),  # a folded continuation line
    NAME,
)
BLOCK = st.lists(LINE, max_size=MAX_HEADERS + 3)


def _gevent_verdict(raw):
    """(accepted?, [(lower name, value)]) as gevent's WSGIHandler would see the block."""
    try:
        message = http.client.parse_headers(io.BytesIO(raw))
    except http.client.HTTPException:
        return False, []
    if message.defects:
        return False, []
    return True, [
        (k.lower(), v.strip(" \t")) for k, v in message.items()
    ]  # surrounding OWS is no part of a value


def _ours(raw):
    headers = RequestHeaders(io.BytesIO(raw))
    if headers.status:
        return False, []
    return True, [
        (line.split(":", 1)[0].lower(), line.split(":", 1)[1].strip(" \t\r\n"))
        for line in headers.headers
    ]


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BLOCK)
def test_the_header_parser_accepts_what_gevents_accepts(lines):
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")
    ours_ok, ours = _ours(raw)
    theirs_ok, theirs = _gevent_verdict(raw)
    if ours_ok:
        # What we accept, gevent accepts, with the same headers (we may refuse more: space
        # before a colon and folding are refused by RFC 9112, which gevent only flags).
        assert theirs_ok, (lines, ours)
        assert sorted(ours) == sorted(theirs), lines
