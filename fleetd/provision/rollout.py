"""`fleetd rollout start`: upgrade a fleet's agents to a bundle, canaries first, then batch by
batch.

fleetd holds the rollout (its plan, each node's progress, pause and abort requests:
services.fleet_ops.rollouts); this process drives it over SSH with the operator's own credentials,
as `fleetd bootstrap` does, so that fleetd itself never holds SSH keys to the hosts
(docs/architecture.md, Rollouts). Each node goes through the upgrade `fleetd bootstrap` makes
(bootstrap.Bootstrapper with upgrade_only): drain to the deadline, install, restart, validate (the
agent heartbeats again running the new bundle), back to the state the operator left it in; a failure
keeps it drained. Before each node it asks fleetd whether it may begin: a paused rollout (by fleetd
after a failed canary or too many failures, or by an operator anywhere) is waited on, an aborted one
stops the driver, and outside the rollout's window no node begins. A driver for CI
(stop_when_paused, `rollout start --wait`) stops at a pause too, so that its caller sees an end.
"""

import concurrent.futures
import dataclasses
import datetime as dt
import time

from fleetd import windows
from fleetd.client import ClientError
from fleetd.provision import bootstrap as bs
from fleetd.provision.ssh import HostSpec

POLL_SECONDS = 2.0
STEPS = ("wait", "connect", "preflight", "install", "configure", "enrol", "start", "ready")


@dataclasses.dataclass(frozen=True)
class RolloutHost(HostSpec):
    """A node's host as the rollout reaches it: its address, and the node it must be."""

    node_id: str = ""


def parse_window(texts, timezone="UTC"):
    """An availability ({timezone, windows}, fleetd.windows) from `[days ]HH:MM-HH:MM` strings such
    as "22:00-06:00" or "sat,sun 00:00-23:59"; None for none. ValueError when one is not that."""
    if not texts:
        return None
    out = []
    for text in texts:
        days, _, span = text.strip().rpartition(" ")
        start, sep, end = span.partition("-")
        if not sep:
            raise ValueError(f"{text!r} is not [DAYS ]HH:MM-HH:MM")
        window = {"start": start, "end": end}
        if days.strip():
            window["days"] = [d.strip().lower()[:3] for d in days.split(",") if d.strip()]
        out.append(window)
    try:
        return windows.validate({"timezone": timezone, "windows": out})
    except windows.WindowError as exc:
        raise ValueError(str(exc)) from None


#: Exit status of `fleetd rollout start --wait` per state the rollout ends (or stops) in; 1 is any
#: other error (click's own), 2 a usage error.
EXIT_STATUS = {"done": 0, "failed": 3, "aborted": 4, "paused": 5}


class Stopped(Exception):
    """The rollout ended (or paused, for a driver that stops there) while the driver waited."""


class RolloutDriver:
    """Drives one rollout that fleetd holds; `progress(host, step, message)` reports as bootstrap's
    does."""

    def __init__(
        self,
        client,
        options,
        ssh_options,
        progress=None,
        clock=time.monotonic,
        sleep=time.sleep,
        now=lambda: dt.datetime.now(dt.timezone.utc),
        max_wait=7 * 86400,
        stop_when_paused=False,
    ):
        self.client = client
        self.options = options
        self.ssh = ssh_options
        self.progress = progress or (lambda host, step, message: None)
        self.clock, self.sleep, self.now = clock, sleep, now
        self.max_wait = max_wait
        self.stop_when_paused = stop_when_paused

    def start(self, fleet, batch, canary, max_failures, window):
        """Create the rollout in fleetd; returns it."""
        bundle = self.options.bundle
        return self.client.post(
            "/api/v1/rollouts",
            {
                "fleet": fleet,
                "bundle_version": bundle.version,
                "bundle_sha256": bundle.sha256,
                "batch": batch,
                "canary": canary,
                "max_failures": max_failures,
                "window": window,
                "drain_deadline_seconds": self.options.drain_deadline,
            },
        )

    def run(self, rollout_id):
        """Take the rollout's nodes batch by batch until it is done or aborted; returns the
        rollout."""
        for _ in range(
            1_000_000
        ):  # each round begins one batch at least, or waits, bounded by max_wait
            try:
                rollout = self._until_runnable(rollout_id)
            except Stopped as exc:
                return exc.args[0]
            pending = [n for n in rollout["nodes"] if n["state"] == "pending"]
            if not pending:
                return self.client.get(f"/api/v1/rollouts/{rollout_id}")
            batch = min(n["batch"] for n in pending)
            nodes = [n for n in pending if n["batch"] == batch]
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(nodes)) as pool:
                began = list(pool.map(lambda n: self._node(rollout_id, n), nodes))
            if not any(
                began
            ):  # fleetd let none begin (a canary still under way): look again in a while
                self.sleep(POLL_SECONDS)
        raise bs.HostFailed("the rollout did not end")  # pragma: no cover - bounded above

    def _until_runnable(self, rollout_id):
        """The rollout once it is running and inside its window; Stopped when it ended meanwhile (or
        paused, with stop_when_paused)."""
        deadline = self.clock() + self.max_wait
        said = None
        for _ in range(int(self.max_wait / POLL_SECONDS) + 2):
            rollout = self.client.get(f"/api/v1/rollouts/{rollout_id}")
            window = rollout.get("window")
            if rollout["state"] in ("done", "failed", "aborted") or (
                rollout["state"] == "paused" and self.stop_when_paused
            ):
                raise Stopped(rollout)
            if rollout["state"] == "paused":
                why = (
                    f"paused: {rollout['state_reason']}; `fleetd rollout resume {rollout_id}` "
                    f"continues it, `fleetd rollout abort {rollout_id}` ends it"
                )
            elif window and not windows.is_open(window, self.now().replace(tzinfo=None)):
                opens = windows.next_open_at(window, self.now().replace(tzinfo=None))
                why = (
                    f"outside its window: no node begins until {opens.isoformat()}Z"
                    if opens
                    else "outside its window"
                )
            else:
                return rollout
            if why != said:
                self.progress("rollout", "wait", why)
                said = why
            if self.clock() >= deadline:
                break
            self.sleep(POLL_SECONDS)
        raise Stopped(self.client.get(f"/api/v1/rollouts/{rollout_id}"))

    def _report(self, rollout_id, node_id, state, detail=""):
        return self.client.patch(
            f"/api/v1/rollouts/{rollout_id}/nodes/{node_id}",
            {"state": state, "detail": detail[:2000]},
        )

    def _node(self, rollout_id, node):
        """One node: upgrading (fleetd may refuse: paused or aborted meanwhile), the upgrade, its
        outcome. Returns whether it began."""
        host = node["address"] or node["hostname"]
        try:
            self._report(rollout_id, node["node_id"], "upgrading")
        except ClientError as exc:
            if exc.status == 409:
                self.progress(host, "wait", f"node {node['node_id']} does not begin: {exc.message}")
                return False
            raise
        spec = RolloutHost(host=host, node_id=node["node_id"])
        # Bootstrapper reports the failure in the result, never raises: its host is on its own.
        result = bs.Bootstrapper(self.client, self.options, self.ssh, progress=self.progress).run(
            [spec]
        )[0]
        if result.ok:
            detail = (
                result.reason
                if result.result == "upgraded"
                else f"{result.result}: {result.reason}"
            )
            self._report(rollout_id, node["node_id"], "done", detail)
        else:
            self._report(rollout_id, node["node_id"], "failed", result.reason)
        return True
