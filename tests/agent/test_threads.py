"""agent.threads: jobs on reused threads."""

import threading

from agent.threads import Pool, PoolWork
from tests.support import wait_until


def test_a_finished_thread_takes_the_next_job():
    pool = Pool("t")
    seen = []
    first = pool.run(lambda: seen.append(threading.get_ident()), name="one")
    assert first.join(5)
    assert wait_until(lambda: pool.idle() == 1, 5.0, 0.01, "one idle thread in the pool")
    second = pool.run(
        lambda: seen.append((threading.get_ident(), threading.current_thread().name)), name="two"
    )
    assert second.join(5)
    assert seen == [seen[0], (seen[0], "two")]  # the same thread, named after the job while it runs
    assert not second.is_alive()


def test_busy_threads_are_not_shared():
    pool = Pool("t")
    gate = threading.Event()
    idents = []
    jobs = [
        pool.run(lambda: (idents.append(threading.get_ident()), gate.wait(5))) for _ in range(3)
    ]
    assert wait_until(lambda: len(idents) == 3, 5.0, 0.01, "three jobs running")
    assert len(set(idents)) == 3
    assert all(job.is_alive() for job in jobs)
    gate.set()
    assert all(job.join(5) for job in jobs)
    assert wait_until(lambda: pool.idle() == 3, 5.0, 0.01, "three idle threads in the pool")


def test_a_job_made_beforehand_is_alive_until_it_ran():
    pool = Pool("t")
    ran = threading.Event()
    job = PoolWork(ran.set, name="later")
    assert job.is_alive() and not job.join(0.01)
    pool.submit(job)
    assert job.join(5) and ran.is_set()


def test_a_failing_job_leaves_the_thread_for_the_next(caplog):
    pool = Pool("t")

    def boom():
        raise RuntimeError("boom")

    assert pool.run(boom, name="bad").join(5)
    assert "thread bad failed" in caplog.text
    assert wait_until(lambda: pool.idle() == 1, 5.0, 0.01, "one idle thread in the pool")
    assert pool.run(lambda: None).join(5)


def test_idle_threads_end():
    pool = Pool("t", idle_seconds=0.05)
    threads = []
    assert pool.run(lambda: threads.append(threading.current_thread())).join(5)
    assert wait_until(lambda: not threads[0].is_alive(), 5.0, 0.01, "the idle thread to end")
    assert pool.idle() == 0
    assert pool.run(lambda: threads.append(threading.current_thread())).join(
        5
    )  # a new thread for the next job
    assert threads[1] is not threads[0] and threads[1].name == "t-2"
