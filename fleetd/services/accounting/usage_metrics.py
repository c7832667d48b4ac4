"""Usage as Prometheus metrics: GPU-hours and cost per team and fleet, from the ledger's sums, with
a cap on how many teams and fleets get their own labels."""

from peewee import fn
from prometheus_client.core import CounterMetricFamily

from fleetd.models import (
    UsageDay,
)

MAX_TEAM_LABELS = (
    50  # the first teams seen (the costliest first) get their own series; later ones are "other"
)


MAX_FLEET_LABELS = 100


class UsageCollector:
    """Prometheus counters of the ledger by team and fleet (bounded label sets), read from its day
    sums at most once per `cache_seconds` (the ledger moves only at its passes).

    A counter never goes down: a team (fleet) keeps the label it was given for the life of the
    process, and once MAX_TEAM_LABELS teams (MAX_FLEET_LABELS fleets) have one, every new team
    counts under "other" for good, so each series sums a set of ledger sums that only grows. The
    labels are given in order of allocated GPU-seconds when first seen, so a new process gives the
    largest teams theirs."""

    def __init__(self, rt, cache_seconds=30.0):
        self.rt = rt
        self.cache_seconds = cache_seconds
        self._cached = None  # (monotonic time, rows)
        self._teams, self._fleets = set(), set()  # the labels given

    def describe(self):
        return []

    def _rows(self):
        now = self.rt.clock.monotonic()
        if self._cached is not None and now - self._cached[0] < self.cache_seconds:
            return self._cached[1]
        rows = list(
            UsageDay.select(
                UsageDay.team,
                UsageDay.fleet,
                fn.SUM(UsageDay.gpu_seconds),
                fn.SUM(UsageDay.used_gpu_seconds),
                fn.SUM(UsageDay.cost),
            )
            .group_by(UsageDay.team, UsageDay.fleet)
            .tuples()
        )
        self._cached = (now, rows)
        return rows

    def collect(self):
        rows = self._rows()
        teams: dict[str, float] = {}
        fleets: dict[str, float] = {}
        for team, fleet, allocated, _, _ in rows:
            teams[team] = teams.get(team, 0.0) + (allocated or 0.0)
            fleets[fleet] = fleets.get(fleet, 0.0) + (allocated or 0.0)
        _give_labels(self._teams, teams, MAX_TEAM_LABELS)
        _give_labels(self._fleets, fleets, MAX_FLEET_LABELS)
        sums: dict[tuple[str, str], list[float]] = {}
        for team, fleet, allocated, used, cost in rows:
            key = (
                team if team in self._teams else "other",
                fleet if fleet in self._fleets else "other",
            )
            entry = sums.setdefault(key, [0.0, 0.0, 0.0])
            entry[0] += allocated or 0.0
            entry[1] += used or 0.0
            entry[2] += cost or 0.0
        families = [
            CounterMetricFamily(name, text, labels=["team", "fleet"])
            for name, text in (
                (
                    "fleetd_usage_allocated_gpu_seconds",
                    "GPU-seconds allocated to workloads, from the usage ledger.",
                ),
                (
                    "fleetd_usage_used_gpu_seconds",
                    "Utilisation-weighted GPU-seconds (where GPU samples came).",
                ),
                (
                    "fleetd_usage_cost",
                    "Cost accounted by the usage ledger (GPU time and instance storage).",
                ),
            )
        ]
        for (team, fleet), values in sorted(sums.items()):
            for family, value in zip(families, values):
                family.add_metric([team or "", fleet or ""], value)
        yield from families


def _give_labels(given, totals, cap):
    """Give labels to names not seen before (`totals`: name -> allocated), the largest first,
    while fewer than `cap` are given; a name left out now stays out."""
    for name in sorted(set(totals) - given, key=lambda n: (-totals[n], n)):
        if len(given) >= cap:
            return
        given.add(name)
