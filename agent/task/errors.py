"""Why a task stops early: the exceptions its lifecycle raises, and the fleetd answers that fence it
off."""

from agent.client import Conflict, Rejected


class TaskError(Exception):
    """The task cannot run; the message is the reason reported to fleetd."""


class LimitError(Exception):
    """A task cannot run with its limits on this host; the message is the reason for fleetd."""


class Fenced(Exception):
    """fleetd no longer leases this task to this node: kill it at once and forget it."""


class Detached(Exception):
    """The agent stops and leaves the process running (an instance's): stop supervising it, kill
    nothing."""


class Stopped(Exception):
    """The task was cancelled (or the agent is stopping) before its process started: the stop's
    (outcome, reason)."""

    def __init__(self, outcome, reason):
        super().__init__(reason)
        self.outcome = outcome
        self.reason = reason


def is_fencing(exc):
    """True for the answers of a task route that mean 'this task is not yours (any more)'."""
    return isinstance(exc, (Conflict, Rejected)) or exc.status in (403, 404)


def is_fencing_artifact(exc):
    """For an artifact download only 409 and 401 say that; a 404 or 403 is about the artifact."""
    return isinstance(exc, (Conflict, Rejected))
