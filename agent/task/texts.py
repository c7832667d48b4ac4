"""The line texts an OutputBatch carries (issue 47): those of the first HEAD_LINES lines of an
output and of the newest ones, bounded in count and bytes whatever the backlog, so that a fleetd
that is slow or down costs the agent no memory: the next batch covers more lines and carries only
the newest texts."""

import collections

from fleetwire.output import HEAD_LINES, MAX_BATCH_LINES

TEXT_BYTES = 16 * 1024  # a longer line's text is cut to this and marked
TRUNCATED_MARK = " [truncated by fleet-agent]"
TEXT_OVERHEAD = 32  # JSON brackets, the line number, the time and the stream, about

Text = tuple[int, int, str, str]  # (line, at_ms, stream, text), as OutputBatch.lines holds them


def line_text(raw):
    """A line's text for fleetd: utf-8 with replacements, no NUL, cut past TEXT_BYTES."""
    cut = len(raw) > TEXT_BYTES
    raw = raw[:TEXT_BYTES]
    if not cut and raw.endswith(b"\r"):
        raw = raw[:-1]
    text = raw.decode("utf-8", "replace").replace("\0", "\ufffd")  # fleetd stores no NUL
    return text + TRUNCATED_MARK if cut else text


def _size(item):
    return len(item[3]) + TEXT_OVERHEAD


class TailTexts:
    """The texts of the lines not yet acknowledged that a batch may carry (not thread-safe: the
    keeper's lock guards it)."""

    def __init__(self, max_lines, max_bytes):
        self.max_lines = min(max_lines, MAX_BATCH_LINES)  # fleetd takes no more
        self.max_bytes = max_bytes
        self._head: list[Text] = []  # lines < HEAD_LINES
        self._recent: collections.deque[Text] = collections.deque()  # the newest lines
        self._recent_bytes = 0

    def add(self, stream, data, first, count, at_ms):
        """Lines [first, first + count) are `data` (whole lines): keep what a batch may need.
        Only the first and the last lines are looked at, so a large read costs no more."""
        pos = 0
        for line in range(first, min(first + count, HEAD_LINES)):
            end = data.find(b"\n", pos)
            self._head.append((line, at_ms, stream, line_text(data[pos:end])))
            pos = end + 1
        newest: list[Text] = []
        budget, end = self.max_bytes, len(data) - 1
        for line in range(first + count - 1, max(first - 1, HEAD_LINES - 1), -1):
            if len(newest) >= self.max_lines or budget <= 0:
                break
            start = data.rfind(b"\n", 0, end) + 1
            item = (line, at_ms, stream, line_text(data[start : min(end, start + TEXT_BYTES + 1)]))
            budget -= _size(item)
            newest.append(item)
            end = start - 1
        for item in reversed(newest):
            self._recent.append(item)
            self._recent_bytes += _size(item)
        for _ in range(len(self._recent)):
            if len(self._recent) <= self.max_lines and (
                self._recent_bytes <= self.max_bytes or len(self._recent) <= 1
            ):
                break
            self._recent_bytes -= _size(self._recent.popleft())

    def pick(self, since, max_texts):
        """The texts for a batch from line `since`, at most `max_texts`: the first lines', then
        the newest that fit the bytes."""
        head = [t for t in self._head if t[0] >= since][:max_texts]
        room = min(max_texts, self.max_lines) - len(head)
        budget = self.max_bytes - sum(_size(t) for t in head)
        newest: list[Text] = []
        for item in reversed(self._recent):
            if item[0] < since or room <= 0 or (budget <= 0 and newest):
                break
            if item[0] < HEAD_LINES:
                continue
            newest.append(item)
            room -= 1
            budget -= _size(item)
        return tuple(head + newest[::-1])

    def drop_before(self, end):
        """Lines before `end` were acknowledged: their texts go."""
        self._head = [t for t in self._head if t[0] >= end]
        for _ in range(len(self._recent)):
            if not self._recent or self._recent[0][0] >= end:
                break
            self._recent_bytes -= _size(self._recent.popleft())
