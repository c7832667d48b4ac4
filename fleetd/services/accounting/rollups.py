"""The ledger's sums that reports read, as a pass adds to them (fleetd.services.accounting.ledger):
per UTC day (UsageDay); per workload and day (UsageWorkloadDay); per workload and month, all fleets
together (UsageWorkloadMonth) and per fleet (UsageWorkloadFleetMonth), each month row with the
first and last day of its month that the workload has day rows on."""

import peewee

from fleetd.models import UsageDay, UsageWorkloadDay, UsageWorkloadFleetMonth, UsageWorkloadMonth
from fleetd.services.accounting.periods import STORAGE

SUMS = ("gpu_seconds", "used_gpu_seconds", "sampled_gpu_seconds", "cost", "runs")
ROLLUPS = (  # (model, its key's columns)
    (
        UsageDay,
        ("day", "kind", "team", "project", "owner_token_id", "owner", "fleet", "gpu_model"),
    ),
    (UsageWorkloadDay, ("day", "kind", "workload_id", "fleet")),
    (UsageWorkloadMonth, ("month", "kind", "workload_id")),
    (UsageWorkloadFleetMonth, ("month", "fleet", "kind", "workload_id")),
)
MONTHS = (UsageWorkloadMonth, UsageWorkloadFleetMonth)  # those that keep their first and last day


def empty():
    """A batch's sums, none yet: model -> {key: [5 sums, attributes]}."""
    return {model: {} for model, _ in ROLLUPS}


def add(sums, at, kind, record, figures):
    """Add `figures` (allocated, used, sampled, cost, runs) to the sums of `at`'s day and month: a
    run's (`record` a UsageRecord, `kind` its own) or an instance volume's (a StorageRecord, kind
    "storage", counted on the instance)."""
    day = at.date()
    workload = ("instance", record.id) if kind == STORAGE else (record.kind, record.workload_id)
    fleet = record.fleet or ""
    attributes = {
        "team": record.team or "",
        "owner_token_id": record.owner_token_id,
        "owner": record.owner,
    }
    keys = {
        UsageDay: (
            day,
            kind,
            record.team or "",
            record.project or "",
            record.owner_token_id,
            record.owner,
            fleet,
            getattr(record, "gpu_model", "") or "",
        ),
        UsageWorkloadDay: (day, *workload, fleet),
        UsageWorkloadMonth: (day.replace(day=1), *workload),
        UsageWorkloadFleetMonth: (day.replace(day=1), fleet, *workload),
    }
    for model, key in keys.items():
        entry = sums[model].get(key)
        if entry is None:
            span = {"first_day": day, "last_day": day} if model in MONTHS else {}
            entry = sums[model][key] = [0.0, 0.0, 0.0, 0.0, 0, {**attributes, **span}]
        elif model in MONTHS:  # every add makes a day row: its month's span takes in that day
            span = entry[5]
            span["first_day"] = min(span["first_day"], day)
            span["last_day"] = max(span["last_day"], day)
        for i, value in enumerate(figures):
            entry[i] += value


def write(sums):
    """Add a batch's sums to the rollups (inside the batch's transaction, the one that moves the
    ledger's rows), and empty them."""
    for model, columns in ROLLUPS:
        rows = [
            {
                **dict(zip(columns, key)),
                **(s[5] if model is not UsageDay else {}),
                **dict(zip(SUMS, s[:5])),
            }
            for key, s in sums[model].items()
        ]
        update = {
            field: field + peewee.EXCLUDED[field.column_name]
            for field in (getattr(model, name) for name in SUMS)
        }
        if model in MONTHS:  # a month's span widens to take in the batch's days
            update.update(_widened(model.first_day, peewee.EXCLUDED.first_day, "<"))
            update.update(_widened(model.last_day, peewee.EXCLUDED.last_day, ">"))
        for i in range(0, len(rows), 100):
            model.insert_many(rows[i : i + 100]).on_conflict(
                conflict_target=[getattr(model, name) for name in columns], update=update
            ).execute()
        sums[model].clear()


def _widened(field, new, op):
    """{field: the new value where it comes before (`op` "<") or after (">") the stored one}."""
    condition = field.is_null() | peewee.Expression(new, op, field)
    return {field: peewee.Case(None, [(condition, new)], field)}
