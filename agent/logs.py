"""Structured logs: one logfmt line per event on stdout (journald adds its own metadata).

Tokens never reach the log: anything shaped like a fleetd token (fla_, flj_, fln_, fll_)
is masked, whatever logged it.
"""

import datetime as dt
import logging
import re
import sys

SECRET_RE = re.compile(r"\b(fl[ajnl]_)[A-Za-z0-9._~+/=-]+")


def redact(text):
    """Mask token-shaped substrings."""
    return SECRET_RE.sub(r"\1<redacted>", text)


def _quote(value):
    text = str(value)
    if text and not re.search(r'[\s"=]', text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class LogfmtFormatter(logging.Formatter):
    """ts=... level=... logger=... msg="..." [error="..."]"""

    def format(self, record):
        ts = dt.datetime.fromtimestamp(record.created, dt.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"
        )
        parts = [
            f"ts={ts[:-4]}Z",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={_quote(redact(record.getMessage()))}",
        ]
        if record.exc_info:
            parts.append(f"error={_quote(redact(self.formatException(record.exc_info)))}")
        return " ".join(parts)


def setup_logging(level="info", stream=None):
    """Send agent logs to stdout as logfmt, one line each."""
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # urllib3 logs every retry and connection with URLs; its news reaches us as exceptions.
    logging.getLogger("urllib3").setLevel(logging.WARNING)
