"""A task's finish report on the wire, defined once (docs/api.md "Agent protocol"): what fleet-agent
sends when a task's process ended (TaskFinish, alone or several in one call) and what fleetd answers
for each in a batch (FinishResult). Each side builds its own message as one of these and reads the
other's with `from_wire` (ValueError names the bad field); fleetd's API schema checks the values
first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fleetwire.checks import is_int
from fleetwire.output import OutputSummary

OUTCOMES = ("succeeded", "failed", "cancelled")


@dataclasses.dataclass(frozen=True)
class TaskFinish:
    """How a task's process ended. The wire form leaves out what is at its default, so that a fleetd
    older than a field never sees it unless it says something."""

    epoch: int
    outcome: str  # succeeded | failed | cancelled
    exit_code: int | None = None
    reason: str = ""
    lost: bool = False  # the agent ended the task itself (stop, restart, upgrade)
    agent_stopping: bool = False  # with lost: because the agent shuts down (no attempt used)
    pid: int | None = None  # the process ended before its start was reported: this reports it too
    started_seconds_ago: float | None = None  # with pid: how long before this report it started
    idle: bool = False  # an instance's run that its idle rule stopped
    ports: tuple[dict[str, int], ...] | None = (
        None  # with pid: an instance's host ports at its start
    )
    output: OutputSummary | None = None  # the task's whole output (None: it wrote none)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epoch": self.epoch, "outcome": self.outcome}
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        if self.reason:
            out["reason"] = self.reason
        for flag in ("lost", "agent_stopping", "idle"):
            if getattr(self, flag):
                out[flag] = True
        if self.pid is not None:
            out["pid"] = self.pid
            if self.started_seconds_ago is not None:
                out["started_seconds_ago"] = round(self.started_seconds_ago, 6)
            if self.ports is not None:
                out["ports"] = [dict(p) for p in self.ports]
        if self.output is not None:
            out["output"] = self.output.to_wire()
        return out

    @classmethod
    def from_wire(cls, data: Any) -> TaskFinish:
        if not isinstance(data, dict):
            raise ValueError("a finish report must be an object")
        epoch, outcome = data.get("epoch"), data.get("outcome")
        if not is_int(epoch) or epoch < 0:
            raise ValueError("epoch must be a non-negative integer")
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}")
        exit_code, pid, ago = (
            data.get("exit_code"),
            data.get("pid"),
            data.get("started_seconds_ago"),
        )
        if exit_code is not None and not is_int(exit_code):
            raise ValueError("exit_code must be an integer or null")
        if pid is not None and (not is_int(pid) or pid < 1):
            raise ValueError("pid must be a positive integer or null")
        if ago is not None and (
            not isinstance(ago, (int, float)) or isinstance(ago, bool) or ago < 0
        ):
            raise ValueError("started_seconds_ago must be a non-negative number or null")
        reason = data.get("reason") or ""
        if not isinstance(reason, str):
            raise ValueError("reason must be a string")
        flags = {}
        for flag in ("lost", "agent_stopping", "idle"):
            value = data.get(flag, False)
            if not isinstance(value, bool):
                raise ValueError(f"{flag} must be true or false")
            flags[flag] = value
        ports = data.get("ports")
        if ports is not None and (
            not isinstance(ports, list) or not all(isinstance(p, dict) for p in ports)
        ):
            raise ValueError("ports must be a list of objects")
        return cls(
            epoch=epoch,
            outcome=outcome,
            exit_code=exit_code,
            reason=reason,
            pid=pid,
            started_seconds_ago=None if ago is None else float(ago),
            ports=None if ports is None else tuple(dict(p) for p in ports),
            output=None if data.get("output") is None else OutputSummary.from_wire(data["output"]),
            **flags,
        )


@dataclasses.dataclass(frozen=True)
class FinishResult:
    """fleetd's answer to one report of a batch: 204 when settled, else what a single finish would
    have got (409 for a stale epoch, 404 for an unknown task) with the error envelope's `error`."""

    task_id: str
    status: int
    error: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "status": self.status, "error": self.error}

    @classmethod
    def from_wire(cls, data: Any) -> FinishResult:
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("task_id"), str)
            or not is_int(data.get("status"))
        ):
            raise ValueError("a finish result must be {task_id, status, error}")
        error = data.get("error")
        if error is not None and not isinstance(error, dict):
            raise ValueError("a finish result's error must be an object or null")
        return cls(task_id=data["task_id"], status=data["status"], error=error)
