"""A task's output kept in chunk files on the node and shipped in the background (issue 47):
the keeper on real files, the runner with real processes against the stand-in fleetd."""

import gzip
import json
import os
import stat
import subprocess
import sys

import pytest

from agent.task.output import OUTPUT_DIR, STATE_NAME, OutputKeeper, OutputSettings
from fleetwire.output import (
    CHUNK_RAW_BYTES,
    HEAD_LINES,
    MIN_OUTPUT_CAP_BYTES,
    iter_frames,
    iter_lines,
)
from tests.agent.conftest import wait_until
from tests.agent.test_runner import assignment, make_runner  # noqa: F401 (fixtures)
from tests.support.workloads import GATE_WAIT, WAIT_FOR_GATE

PY = sys.executable


def _frames(directory):
    """(name, frames) of every open chunk file in a task directory's output dir."""
    out_dir = os.path.join(directory, OUTPUT_DIR)
    return [
        (name, list(iter_frames(open(os.path.join(out_dir, name), "rb").read())))
        for name in sorted(os.listdir(out_dir))
        if name.endswith(".frames")
    ]


def _write(path, data):
    with open(path, "ab") as fh:
        fh.write(data)


# The keeper on real files.


def test_lines_are_numbered_across_streams_in_one_frame_per_stream_and_read(tmp_path):
    keeper = OutputKeeper(str(tmp_path), 3, label="t/3")
    _write(tmp_path / "stdout.log", b"o0\no1\npart")
    _write(tmp_path / "stderr.log", b"e0\n")
    assert keeper.pump() == (True, True)
    _write(tmp_path / "stdout.log", b"ial\n")
    keeper.pump()
    [(name, frames)] = _frames(tmp_path)
    assert name == f"{0:012d}.frames"
    assert [(stream, data) for _at, stream, data in frames] == [
        ("stdout", b"o0\no1\n"),
        ("stderr", b"e0\n"),
        ("stdout", b"partial\n"),
    ]
    batch = keeper.batch(1000)
    assert (batch.epoch, batch.first_line, batch.count, batch.bytes) == (3, 0, 4, 17)
    assert [(n, stream, text) for n, _at, stream, text in batch.lines] == [
        (0, "stdout", "o0"),
        (1, "stdout", "o1"),
        (2, "stderr", "e0"),
        (3, "stdout", "partial"),
    ]
    state = json.load(open(tmp_path / STATE_NAME))
    assert state["offsets"] == {"stdout": 14, "stderr": 3} and state["next_line"] == 4
    assert stat.S_IMODE(os.stat(tmp_path / STATE_NAME).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / OUTPUT_DIR).st_mode) == 0o700


def test_a_batch_carries_every_line_since_the_last_ack_but_only_head_and_newest_texts(tmp_path):
    keeper = OutputKeeper(str(tmp_path), 1, settings=OutputSettings(batch_lines=300))
    _write(tmp_path / "stdout.log", b"".join(b"line %d\n" % i for i in range(5000)))
    keeper.pump()
    batch = keeper.batch(300)
    numbers = [line[0] for line in batch.lines]
    assert batch.count == 5000 and len(numbers) == 300
    assert numbers == list(range(HEAD_LINES)) + list(range(5000 - 200, 5000))
    keeper.acked(batch)
    _write(tmp_path / "stdout.log", b"more\n")
    keeper.pump()
    after = keeper.batch(300)
    assert (after.first_line, after.count, [t[3] for t in after.lines]) == (5000, 1, ["more"])


def test_an_agent_restart_resumes_with_no_line_skipped_or_numbered_twice(tmp_path):
    first = OutputKeeper(str(tmp_path), 1)
    _write(tmp_path / "stdout.log", b"".join(b"a%d\n" % i for i in range(10)))
    first.pump()
    # The agent dies after more frames went into the chunk than its state file says.
    _write(tmp_path / "stdout.log", b"".join(b"b%d\n" % i for i in range(5)))
    first.pump()
    saved = open(tmp_path / STATE_NAME).read()
    _write(tmp_path / "stdout.log", b"c0\nc1\n")
    first.pump()
    open(tmp_path / STATE_NAME, "w").write(saved)
    _write(tmp_path / "stderr.log", b"late\n")

    again = OutputKeeper(str(tmp_path), 1)
    assert again.finish().lines == 18
    [chunk] = again.sealed
    blob = again.chunk_blob(chunk)
    lines = [data for _at, _s, data in iter_lines(gzip.decompress(blob))]
    assert lines == [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(5)] + [
        b"c0",
        b"c1",
        b"late",
    ]
    assert chunk.lines == 18 and chunk.bytes == len(gzip.decompress(blob))


def test_a_silent_task_leaves_no_file_so_that_its_directory_may_be_reused(tmp_path):
    keeper = OutputKeeper(str(tmp_path), 1)
    _write(tmp_path / "stdout.log", b"")
    assert keeper.pump() == (False, True)
    assert keeper.finish() is None and not keeper.pending()
    assert sorted(os.listdir(tmp_path)) == ["stdout.log"]


def test_a_chunk_is_sealed_past_its_age(tmp_path):
    keeper = OutputKeeper(str(tmp_path), 1, settings=OutputSettings(chunk_age_seconds=0.0))
    _write(tmp_path / "stdout.log", b"one\n")
    keeper.pump()
    _write(tmp_path / "stdout.log", b"two\n")
    keeper.pump()
    assert [(c.first_line, c.lines) for c in keeper.sealed] == [(0, 1), (1, 1)]
    assert keeper.open is None


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (the tests run as root; skipped where mounting is not allowed)."""
    path = tmp_path / "disk"
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_disk_keeps_the_output_waiting_in_its_files_until_there_is_room(small_disk):
    keeper = OutputKeeper(str(small_disk), 1, label="t/1")
    _write(small_disk / "stdout.log", b"".join(b"before %d\n" % i for i in range(100)))
    filler = small_disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(10_000):  # until the disk is full
            os.write(fd, b"x" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    assert keeper.pump() == (False, False)  # nothing kept, nothing consumed, no exception
    assert keeper.next_line == 0 and keeper.offsets["stdout"] == 0
    os.unlink(filler)
    _write(small_disk / "stdout.log", b"after\n")
    summary = keeper.finish()
    assert summary.lines == 101
    [chunk] = keeper.sealed
    raw = gzip.decompress(keeper.chunk_blob(chunk))
    assert [d for _a, _s, d in iter_lines(raw)] == [b"before %d" % i for i in range(100)] + [
        b"after"
    ]


# The runner, real processes, the stand-in fleetd.


def test_binary_and_invalid_utf8_are_kept_as_written_and_shown_with_replacements(
    make_runner, fleetd
):
    runner = make_runner()
    code = "import sys\nsys.stdout.buffer.write(b'\\xff\\xfeok\\x00\\n\\xc3\\x28\\n')\n"
    runner.submit(assignment("t-bin", [PY, "-c", code]))
    assert fleetd.wait_finished("t-bin")["output"]["lines"] == 2
    assert fleetd.texts("t-bin") == ["\ufffd\ufffdok\ufffd", "\ufffd("]
    assert [line[3] for line in fleetd.chunk_lines("t-bin")] == [b"\xff\xfeok\x00", b"\xc3\x28"]


def test_a_chunk_is_sealed_at_its_size_and_at_the_end(make_runner, fleetd):
    runner = make_runner()
    lines = 6 * CHUNK_RAW_BYTES // 4 // 100
    code = f"for i in range({lines}):\n    print(f'{{i:09d}} ' + 'z' * 89)\n"
    runner.submit(assignment("t-big", [PY, "-c", code]))
    assert fleetd.wait_finished("t-big")["output"]["lines"] == lines
    assert fleetd.texts("t-big") == [f"{i:09d} " + "z" * 89 for i in range(lines)]
    with fleetd.cond:
        metas = [meta for meta, _ in fleetd.chunks["t-big"].values()]
    assert len(metas) >= 2 and all(m.bytes <= CHUNK_RAW_BYTES for m in metas)
    assert sorted(fleetd.chunk_puts["t-big"]) == sorted(fleetd.chunks["t-big"])  # each once


def test_uploads_are_retried_while_fleetd_refuses_and_the_directory_goes_once_stored(
    make_runner, fleetd
):
    fleetd.down.add("output")
    runner = make_runner()
    runner.submit(assignment("t-retry", [PY, "-c", "print('kept')"]))
    assert fleetd.wait_finished("t-retry")["output"] == {
        "lines": 1,
        "bytes": 5,
        "truncated": False,
    }
    fleetd.wait_for(
        lambda: sum(1 for m, p, _ in fleetd.calls if m == "PUT" and "t-retry" in p) >= 3,
        message="upload retries",
    )
    task_dir = os.path.join(runner.tasks_dir, "t-retry.1")
    assert os.listdir(os.path.join(task_dir, OUTPUT_DIR)) == [f"{0:012d}.gz"]
    fleetd.down.discard("output")
    assert fleetd.texts("t-retry") == ["kept"]
    wait_until(lambda: not os.path.exists(task_dir), message="the task directory to go")
    assert fleetd.chunk_puts["t-retry"] == [0]


def test_the_finish_report_does_not_wait_for_the_upload(make_runner, fleetd):
    fleetd.hold_chunks.clear()
    runner = make_runner()
    runner.submit(assignment("t-held", [PY, "-c", "print('a'); print('b')"]))
    assert fleetd.wait_finished("t-held")["output"]["lines"] == 2
    assert "t-held" not in fleetd.chunks
    fleetd.hold_chunks.set()
    assert fleetd.texts("t-held") == ["a", "b"]


def test_a_task_without_output_reports_none_and_makes_no_chunk(make_runner, fleetd):
    runner = make_runner()
    runner.submit(assignment("t-quiet", ["true"]))
    assert "output" not in fleetd.wait_finished("t-quiet")
    wait_until(lambda: runner.get("t-quiet") is None, message="the task to be done")
    assert not [p for m, p, _ in fleetd.calls if "t-quiet/output" in p or "t-quiet/logs" in p]


def test_the_cap_warns_at_a_tenth_then_cuts_the_output_with_a_marked_line(make_runner, fleetd):
    cap = MIN_OUTPUT_CAP_BYTES
    runner = make_runner()
    code = "for i in range(2000):\n    print(f'{i:05d} ' + 'c' * 93)\n"
    runner.submit(assignment("t-cap", [PY, "-c", code], output_cap_bytes=cap))
    summary = fleetd.wait_finished("t-cap")["output"]
    assert summary["truncated"] is True and summary["bytes"] <= cap + 200
    texts = fleetd.texts("t-cap")
    assert texts[-1] == (
        f"[fleet-agent] output cap of {cap} bytes reached: the rest of this task's output is "
        "discarded"
    )
    assert texts[:-1] == [f"{i:05d} " + "c" * 93 for i in range(len(texts) - 1)]
    assert fleetd.chunk_lines("t-cap")[-1][2] == "system"
    batches = fleetd.wait_for(
        lambda: (b := fleetd.batches.get("t-cap")) and b[-1].notice == "cap_reached" and b,
        message="the cap_reached batch",
    )
    notices = [b.notice for b in batches if b.notice]
    assert notices in (["cap_warning", "cap_reached"], ["cap_reached"])


def test_a_restarted_agent_uploads_what_the_last_one_left_and_reports_nothing_twice(
    make_runner, fleetd, tmp_path
):
    fleetd.down.add("output")
    runner = make_runner("node")
    runner.submit(assignment("t-left", [PY, "-c", "print('one'); print('two')"]))
    fleetd.wait_finished("t-left")
    fleetd.wait_for(
        lambda: any(m == "PUT" and "t-left" in p for m, p, _ in fleetd.calls), message="a PUT"
    )
    runner.shutdown("fleet-agent stopped", timeout=15)
    task_dir = tmp_path / "node" / "tasks" / "t-left.1"
    assert (task_dir / OUTPUT_DIR).is_dir()
    fleetd.down.discard("output")
    again = make_runner("node")
    assert again.recover() == []  # nothing killed, nothing reported
    assert fleetd.texts("t-left") == ["one", "two"]
    wait_until(lambda: not task_dir.exists(), message="the task directory to go")
    finishes = [p for _m, p, _ in fleetd.calls if p.endswith("t-left/finish")]
    assert len(finishes) + sum(1 for _m, p, b in fleetd.calls if p == "/api/v1/agent/finish") == 1


def test_a_409_on_the_output_stops_its_shipping_and_the_directory_goes(make_runner, fleetd):
    fleetd.hold_chunks.clear()
    runner = make_runner()
    runner.submit(assignment("t-gone", [PY, "-c", "print('x')"]))
    fleetd.wait_finished("t-gone")
    fleetd.fenced.add("t-gone")
    fleetd.hold_chunks.set()
    task_dir = os.path.join(runner.tasks_dir, "t-gone.1")
    wait_until(lambda: not os.path.exists(task_dir), message="the task directory to go")
    assert "t-gone" not in fleetd.chunks


def test_lines_written_while_the_process_waits_arrive_in_a_batch_before_its_end(
    make_runner, fleetd, gate
):
    runner = make_runner()
    code = "print('ready', flush=True)\n" + WAIT_FOR_GATE
    runner.submit(assignment("t-live", [PY, "-c", code, gate.path]))
    batch = fleetd.wait_for(lambda: fleetd.batches.get("t-live"), message="a batch")[0]
    assert (batch.first_line, batch.count, batch.lines[0][2:]) == (0, 1, ("stdout", "ready"))
    assert "t-live" not in fleetd.finished
    gate.open()
    fleetd.wait_finished("t-live")


def test_a_job_task_taken_back_after_an_agent_restart_has_each_line_once(
    make_runner, fleetd, gate, tmp_path
):
    runner = make_runner("node")
    code = (
        "import sys\n" + GATE_WAIT + "for i in range(50):\n    print(f'before {i}', flush=True)\n"
        "gate_wait(sys.argv[1])\nfor i in range(50):\n    print(f'after {i}', flush=True)\n"
    )
    task = runner.submit(assignment("t-back", [PY, "-c", code, gate.path]))
    fleetd.wait_for(
        lambda: len(fleetd.logs.get("t-back", {})) >= 50 and fleetd.started.get("t-back"),
        message="the first lines",
    )
    # The agent goes and leaves the process running, as a crashed one does (nothing reported).
    task._detached = True
    task.process.wake.set()
    wait_until(lambda: runner.get("t-back") is None, message="the task to be let go")
    gate.open()
    stdout = tmp_path / "node" / "tasks" / "t-back.1" / "stdout.log"
    wait_until(lambda: "after 49\n" in stdout.read_text(), message="lines written meanwhile")

    again = make_runner("node")
    assert again.recover() == []
    assert fleetd.wait_finished("t-back")["output"]["lines"] == 100
    expected = [f"before {i}" for i in range(50)] + [f"after {i}" for i in range(50)]
    assert fleetd.texts("t-back") == expected
    assert [n for n, *_ in fleetd.chunk_lines("t-back")] == list(range(100))
