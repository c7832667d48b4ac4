"""A task's output as fleetd keeps it: line batches numbered in order of arrival, a bounded tail
of text, chunks in the output store, pages over the whole, search, download, info, retention."""

import gzip
import itertools
import os
import time

import boto3
import pytest
from moto.server import ThreadedMotoServer

from fleetd.services.workloads.output_store import DirectoryStore, make_store
from fleetwire.output import encode_frame
from tests.conftest import admin_client

T_MS = int(time.time() * 1000)


@pytest.fixture(scope="module")
def s3_server():
    """An S3-compatible server (moto's) on 127.0.0.1, for the stores kept in a bucket."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


BUCKETS = itertools.count()


@pytest.fixture(params=["directory", "bucket"])
def api(request, make_app, clock, monkeypatch):
    store = {}
    if request.param == "bucket":
        endpoint = request.getfixturevalue("s3_server")
        for name, value in (
            ("AWS_ACCESS_KEY_ID", "fleetd-test"),
            ("AWS_SECRET_ACCESS_KEY", "fleetd-test-secret"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
        ):
            monkeypatch.setenv(name, value)
        bucket = f"fleetd-output-{next(BUCKETS)}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        store = {"output_store": f"s3://{bucket}/tests", "output_s3_endpoint": endpoint}
    client = admin_client(make_app(output_tail_lines=50, **store), clock)
    client.create_fleet("gpu-a")
    return client


def _stored_keys(api):
    """The keys the app's output store holds (a directory's files, a bucket's objects)."""
    store = api.app.extensions["fleetd"].output_store
    if isinstance(store, DirectoryStore):
        return [name for _d, _s, files in os.walk(store.root) for name in files]
    listed = store.client.list_objects_v2(Bucket=store.bucket)
    return [item["Key"] for item in listed.get("Contents", [])]


def _node(api, name="n1"):
    return api.ready_node(api.create_join_token("gpu-a"), name)[1]


def _running(api, session, **spec):
    job = api.submit(**spec)
    return job["id"], api.start_task(session)


def _lines(first, count, stream="stdout"):
    return [f"{stream} line {n}" for n in range(first, first + count)]


def _batch(api, session, assignment, first, count, texts=None, expect=204, **extra):
    texts = _lines(first, count) if texts is None else texts
    body = {
        "epoch": assignment["epoch"],
        "first_line": first,
        "count": count,
        "first_at": T_MS,
        "last_at": T_MS + 1,
        "bytes": sum(len(t) + 1 for t in texts),
        "lines": [[first + count - len(texts) + i, T_MS, "stdout", t] for i, t in enumerate(texts)],
        **extra,
    }
    resp = api.post(
        f"/api/v1/agent/tasks/{assignment['task_id']}/logs", body, token=session, agent=True
    )
    assert resp.status_code == expect, resp.get_json()
    return resp


def _chunk(first, count, stream="stdout", at=T_MS):
    data = "".join(f"{t}\n" for t in _lines(first, count, stream)).encode()
    return encode_frame(at, stream, data)


def _upload(api, session, assignment, first, frames, lines, expect=204, epoch=None, blob=None):
    blob = gzip.compress(frames) if blob is None else blob
    query = (
        f"epoch={assignment['epoch'] if epoch is None else epoch}&lines={lines}"
        f"&bytes={len(frames)}&first_at={T_MS}&last_at={T_MS + 5}"
    )
    resp = api.call(
        "PUT",
        f"/api/v1/agent/tasks/{assignment['task_id']}/output/{first}?{query}",
        token=session,
        agent=True,
        data=blob,
        headers={"Content-Type": "application/gzip"},
    )
    assert resp.status_code == expect, resp.get_json()
    return resp


def _all(api, path, **query):
    items, after = [], None
    for _ in range(1000):
        params = dict(query, **({"after": after} if after is not None else {}))
        page = api.get(path, query_string=params).get_json()
        items += page["items"]
        after = page["next_cursor"]
        if after is None:
            return items
    raise AssertionError("no end of pages")


def test_batches_keep_a_head_and_a_tail_and_chunks_give_back_every_line(api):
    session = _node(api)
    job_id, assignment = _running(api, session)
    _batch(api, session, assignment, 0, 100)
    # A backlog: 5,000 lines, of which the batch carries only the newest 200 texts.
    _batch(api, session, assignment, 100, 5000, _lines(4900, 200))
    logs = f"/api/v1/jobs/{job_id}/logs"
    items = _all(api, logs)
    texts = [i["text"] for i in items]
    assert texts[:100] == _lines(0, 100)
    assert texts[100].startswith("[fleetd] lines 100-5049 of rank 0 are on node")
    assert texts[101:] == _lines(5050, 50)  # the tail kept: 50 lines
    assert [i["seq"] for i in items] == sorted(i["seq"] for i in items)
    info = api.get(f"/api/v1/jobs/{job_id}/output/info").get_json()
    assert info["lines"] == 5100 and info["stored_bytes"] == 0
    assert info["pending_ranges"] == [
        {
            "rank": 0,
            "attempt": 1,
            "first_line": 0,
            "lines": 5100,
            "node_id": info["outputs"][0]["node_id"],
        }
    ]
    # The node uploads the whole in two chunks: every line reads back, in order, with its seq.
    _upload(api, session, assignment, 0, _chunk(0, 3000), 3000)
    _upload(api, session, assignment, 3000, _chunk(3000, 2100), 2100)
    _upload(api, session, assignment, 3000, _chunk(3000, 2100), 2100)  # again: stored once
    items = _all(api, logs)
    assert [i["text"] for i in items] == _lines(0, 5100)
    assert [i["line"] for i in items] == list(range(5100))
    info = api.get(f"/api/v1/jobs/{job_id}/output/info").get_json()
    assert info["pending_ranges"] == [] and info["stored_bytes"] > 0
    whole = api.get(f"/api/v1/jobs/{job_id}/output")
    assert whole.status_code == 200 and whole.mimetype == "text/plain"
    assert whole.get_data().decode().splitlines() == _lines(0, 5100)
    packed = api.get(f"/api/v1/jobs/{job_id}/output?gzip=true").get_data()
    assert gzip.decompress(packed).decode().splitlines() == _lines(0, 5100)


def test_a_follower_reads_on_from_its_cursor_and_ranks_interleave_in_arrival_order(api):
    s1, s2 = _node(api, "n1"), _node(api, "n2")
    job = api.submit(num_nodes=2, resources={"gpus": 1})
    a1, a2 = api.start_task(s1), api.start_task(s2)
    first, second = (a1, a2) if a1["rank"] == 0 else (a2, a1)
    (s_first, s_second) = (s1, s2) if a1["rank"] == 0 else (s2, s1)
    _batch(api, s_first, first, 0, 3)
    page = api.get(f"/api/v1/jobs/{job['id']}/logs").get_json()
    cursor = page["items"][-1]["seq"]
    _batch(api, s_second, second, 0, 2, ["b0", "b1"])
    _batch(api, s_first, first, 3, 2, ["a3", "a4"])
    page = api.get(f"/api/v1/jobs/{job['id']}/logs?after={cursor}").get_json()
    assert [(i["rank"], i["text"]) for i in page["items"]] == [
        (1, "b0"),
        (1, "b1"),
        (0, "a3"),
        (0, "a4"),
    ]
    only = api.get(f"/api/v1/jobs/{job['id']}/logs?rank=1").get_json()["items"]
    assert [i["text"] for i in only] == ["b0", "b1"]
    two = api.get(f"/api/v1/jobs/{job['id']}/output").get_data().decode().splitlines()
    assert two[0] == "==> rank 0, attempt 1 <==" and "==> rank 1, attempt 1 <==" in two


def test_search_covers_the_whole_output_and_a_regex_that_would_backtrack_is_linear(api):
    session = _node(api)
    job_id, assignment = _running(api, session)
    _batch(api, session, assignment, 0, 4000, _lines(3950, 50))
    frames = _chunk(0, 2000) + encode_frame(T_MS + 10, "stderr", b"ERROR disk full\n")
    frames += _chunk(2001, 1999)
    _upload(api, session, assignment, 0, frames, 4000)
    logs = f"/api/v1/jobs/{job_id}/logs"
    found = _all(api, logs, q="ERROR")
    assert [(i["line"], i["stream"], i["text"]) for i in found] == [
        (2000, "stderr", "ERROR disk full")
    ]
    assert [i["line"] for i in _all(api, logs, q="line 3[0-9]{2}$", q_regex="true")] == list(
        range(300, 400)
    )
    assert _all(api, logs, q="(a+)+$", q_regex="true") == []
    assert [i["text"] for i in _all(api, logs, stream="stderr")] == ["ERROR disk full"]
    bad = api.get(f"{logs}?q=(unclosed&q_regex=true")
    assert bad.status_code == 400 and "regex" in bad.get_json()["error"]["message"]


def test_uploads_and_batches_from_another_node_or_a_bad_chunk_are_refused(api):
    session, other = _node(api, "n1"), _node(api, "n2")
    job_id, assignment = _running(api, session)
    _batch(api, other, assignment, 0, 1, expect=409)
    _upload(api, other, assignment, 0, _chunk(0, 2), 2, expect=409)
    _upload(api, session, assignment, 0, _chunk(0, 2), 3, expect=400)  # the count is wrong
    _upload(api, session, assignment, 0, b"", 1, blob=b"not gzip", expect=400)
    frames = _chunk(0, 2)
    _upload(api, session, assignment, 0, frames, 2, blob=gzip.compress(frames)[:-6], expect=400)
    assert api.get(f"/api/v1/jobs/{job_id}/output/info").get_json()["stored_bytes"] == 0


def test_the_node_that_ran_an_output_uploads_it_after_the_job_ended(api):
    session = _node(api)
    job_id, assignment = _running(api, session)
    api.task_call(
        session,
        assignment,
        "finish",
        outcome="succeeded",
        exit_code=0,
        output={"lines": 3, "bytes": 30},
    )
    assert api.job(job_id)["state"] == "succeeded"
    info = api.get(f"/api/v1/jobs/{job_id}/output/info").get_json()
    assert info["lines"] == 3 and info["pending_ranges"][0]["lines"] == 3
    _upload(api, session, assignment, 0, _chunk(0, 3), 3)
    assert api.get(f"/api/v1/jobs/{job_id}/output").get_data().decode().splitlines() == _lines(0, 3)
    assert [i["text"] for i in _all(api, f"/api/v1/jobs/{job_id}/logs")] == _lines(0, 3)


def test_an_older_agents_lines_are_numbered_and_kept_like_a_batch(api):
    session = _node(api)
    job_id, assignment = _running(api, session)
    api.task_call(session, assignment, "logs", lines=[["stdout", "one"], ["stderr", "two"]])
    api.task_call(session, assignment, "logs", lines=[["stdout", "three", 0]])
    items = _all(api, f"/api/v1/jobs/{job_id}/logs")
    assert [(i["line"], i["stream"], i["text"]) for i in items] == [
        (0, "stdout", "one"),
        (1, "stderr", "two"),
        (2, "stdout", "three"),
    ]


def test_the_cap_notices_become_events_and_the_cap_comes_from_the_job(api):
    session = _node(api)
    job_id, assignment = _running(api, session, output_cap_bytes=1 << 20)
    assert assignment["output_cap_bytes"] == 1 << 20
    _batch(api, session, assignment, 0, 1, notice="cap_warning")
    _batch(api, session, assignment, 1, 1, notice="cap_reached")
    kinds = [e["kind"] for e in api.get(f"/api/v1/jobs/{job_id}/events").get_json()["items"]]
    assert "job.output_cap_warning" in kinds and "job.output_truncated" in kinds
    info = api.get(f"/api/v1/jobs/{job_id}/output/info").get_json()
    assert info["truncated"] is True and info["cap_bytes"] == 1 << 20


def test_retention_removes_stored_output_past_its_fleets_days(api, clock, tmp_path):
    session = _node(api)
    job_id, assignment = _running(api, session)
    _batch(api, session, assignment, 0, 2)
    _upload(api, session, assignment, 0, _chunk(0, 2), 2)
    api.task_call(session, assignment, "finish", outcome="succeeded", exit_code=0)
    assert _stored_keys(api)
    clock.advance(29 * 86400)
    assert api.run_task("gc")["output_bytes"] == 0
    clock.advance(2 * 86400)
    result = api.run_task("gc")
    assert result["outputs"] == 1 and result["output_bytes"] > 0
    assert _stored_keys(api) == []
    info = api.get(f"/api/v1/jobs/{job_id}/output/info").get_json()
    assert info["stored_bytes"] == 0


def test_a_store_that_cannot_take_a_chunk_answers_503_and_stores_it_when_it_can(
    make_app, clock, tmp_path
):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    api = admin_client(make_app(output_dir=str(blocked / "output")), clock)
    api.create_fleet("gpu-a")
    session = _node(api)
    job_id, assignment = _running(api, session)
    resp = _upload(api, session, assignment, 0, _chunk(0, 2), 2, expect=503)
    assert resp.headers["Retry-After"] and resp.get_json()["error"]["code"] == "unavailable"
    assert api.get(f"/api/v1/jobs/{job_id}/output/info").get_json()["stored_bytes"] == 0
    blocked.unlink()
    _upload(api, session, assignment, 0, _chunk(0, 2), 2)
    assert api.get(f"/api/v1/jobs/{job_id}/output").get_data().decode().splitlines() == _lines(0, 2)


def test_a_bucket_that_refuses_answers_503_and_a_store_setting_must_name_a_bucket(
    make_app, make_settings, clock, monkeypatch, s3_server
):
    for name, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    missing = {"output_store": "s3://no-such-bucket/x", "output_s3_endpoint": s3_server}
    api = admin_client(make_app(**missing), clock)
    api.create_fleet("gpu-a")
    session = _node(api)
    job_id, assignment = _running(api, session)
    resp = _upload(api, session, assignment, 0, _chunk(0, 2), 2, expect=503)
    assert "NoSuchBucket" in resp.get_json()["error"]["message"]
    for bad in ("gs://bucket/x", "s3:///x", "s3://bucket/x?versionId=1"):
        with pytest.raises(ValueError, match="s3://BUCKET/PREFIX"):
            make_store(make_settings(output_store=bad))
