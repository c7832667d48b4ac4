"""Log boxes of job and instance pages: the newest lines shown first, new ones appended as they come
(the page polls), earlier ones loaded on request ("Load earlier lines")."""

from flask import Response, render_template, request, stream_with_context

from fleetd.errors import InvalidRequest

SHOWN = 200  # lines a page opens with, and lines each "load earlier" adds
POLL_LIMIT = 500  # lines one poll brings at most (a full batch polls again at once)


def seq_arg(name):
    """A log line number from the query string (None when absent); InvalidRequest when it is not
    one."""
    raw = request.args.get(name)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be a log line number") from None


FOUND_SHOWN = 200  # lines a search shows


def box(lines, url_for_log, polling, done_text, search_url=None, download_url=None):
    """What _log_box.html needs: the newest `lines` (oldest first), where to poll for newer ones and
    where to ask for earlier ones (when the box may not hold the start of the log).
    `url_for_log(**args)` makes the log route's address."""
    first = lines[0].id if lines else None
    last = lines[-1].id if lines else None
    return {
        "lines": lines,
        "polling": polling,
        "done_text": done_text,
        "poll_url": url_for_log(after=last) if last is not None else url_for_log(),
        "earlier_url": url_for_log(before=first) if len(lines) >= SHOWN else None,
        "search_url": search_url,
        "download_url": download_url,
    }


def newer(fetch_after, url_for_log, still_writing, done_text, extra=""):
    """The poll's answer: lines after `after` (appended out of band), `extra` (other parts of the
    page, swapped out of band) and the next poller."""
    after = seq_arg("after")
    lines = fetch_after(after, POLL_LIMIT)
    last = lines[-1].id if lines else after
    # Keep polling while the workload may still write, and while a full batch says more is waiting.
    polling = still_writing or len(lines) == POLL_LIMIT
    return render_template(
        "_log_poll.html",
        lines=lines,
        polling=polling,
        done_text=done_text,
        extra=extra,
        poll_url=url_for_log(after=last) if last is not None else url_for_log(),
    )


def earlier(fetch_before, url_for_log):
    """ "Load earlier lines": up to SHOWN lines before `before` (put at the top out of band), and
    the button again while more may come before them."""
    before = seq_arg("before")
    if before is None:
        raise InvalidRequest("before is required: the number of the first line shown")
    lines = fetch_before(before, SHOWN)
    more = len(lines) == SHOWN
    return render_template(
        "_log_earlier.html",
        lines=lines,
        earlier_url=url_for_log(before=lines[0].id) if more else None,
    )


def found(search):
    """A search's answer: up to FOUND_SHOWN lines of the whole output that hold `q` (a regex with
    `regex=true`). `search(limit, q, q_regex)` gives (lines, cursor)."""
    q = (request.args.get("q") or "").strip()
    if not q or len(q) > 300:
        return render_template("_log_found.html", error="Search for 1 to 300 characters.")
    try:
        lines, cursor = search(FOUND_SHOWN, q, request.args.get("regex") == "true")
    except InvalidRequest as exc:
        return render_template("_log_found.html", error=exc.message)
    return render_template("_log_found.html", lines=lines, more=cursor is not None)


def whole(pieces, name):
    """A whole output as a download named `name`."""
    response = Response(stream_with_context(pieces), mimetype="text/plain")
    response.headers["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
