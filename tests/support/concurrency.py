"""Requests released at once from many threads, for the tests of what must happen exactly once."""

import threading


def all_at_once(count, request):
    """Run request(i) -> response in `count` threads released together by a barrier; their status
    codes, sorted."""
    barrier, results, lock = threading.Barrier(count), [], threading.Lock()

    def attempt(i):
        barrier.wait(timeout=30)
        resp = request(i)
        with lock:
            results.append(resp.status_code)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == count, f"{count - len(results)} of {count} requests did not finish"
    return sorted(results)
