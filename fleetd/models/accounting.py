"""What work costs: GPU types and prices, quotas, the usage ledger, storage, budgets."""

import peewee

from fleetd.models.base import BaseModel, JSONText


class GpuType(BaseModel):
    """Prices of a GPU model, set by an admin (the model name is what agents report)."""

    model = peewee.CharField(primary_key=True, max_length=128)
    price_per_hour = peewee.FloatField(null=True)
    spot_min_bid = peewee.FloatField(null=True)


class Quota(BaseModel):
    """The most GPUs a team's running jobs may hold, per priority class ("any" for all classes)."""

    team = peewee.CharField(max_length=200)
    priority_class = peewee.CharField(max_length=16)
    max_gpus = peewee.FloatField()

    class Meta:
        primary_key = peewee.CompositeKey("team", "priority_class")


class UsageRecord(BaseModel):
    """The usage ledger: one row per run of a workload (a job's task in one attempt, keyed
    "<task id>.<epoch>"; an instance's run), its GPU-seconds and cost as far as `accounted_until`
    (the `usage` background task moves it on; fleetd.services.accounting.usage)."""

    id = peewee.CharField(primary_key=True, max_length=48)
    kind = peewee.CharField(max_length=16)  # job or instance
    workload_id = peewee.CharField(max_length=32, index=True)  # the job's id, or the instance's
    workload_name = peewee.CharField(max_length=200)
    task_id = peewee.CharField(max_length=32)
    job_id = peewee.CharField(max_length=32)  # the job, or the instance's run
    rank = peewee.IntegerField(default=0)
    attempt = peewee.IntegerField(default=1)  # the job's attempt, or the instance's run number
    owner = peewee.CharField(max_length=200)
    owner_token_id = peewee.CharField(max_length=32)
    team = peewee.CharField(max_length=200, default="")
    project = peewee.CharField(max_length=32, default="")  # its job's project (migration 0036)
    fleet = peewee.CharField(max_length=63, default="")
    node_id = peewee.CharField(max_length=32, default="")
    gpu_model = peewee.CharField(max_length=128, default="")
    priority_class = peewee.CharField(max_length=16, default="on-demand")
    gpus = peewee.FloatField(default=0.0)  # GPUs held, fractions included
    gpu_uuids = JSONText(default=list)
    bid = peewee.FloatField(null=True)  # a spot run's bid per GPU-hour: its price
    started_at = peewee.DateTimeField(index=True)
    ended_at = peewee.DateTimeField(null=True, index=True)
    accounted_until = peewee.DateTimeField()
    gpu_seconds = peewee.FloatField(default=0.0)  # allocated
    used_gpu_seconds = peewee.FloatField(default=0.0)  # utilisation-weighted, over the sampled part
    sampled_gpu_seconds = peewee.FloatField(default=0.0)  # allocated GPU-seconds that had samples
    cost = peewee.FloatField(default=0.0)
    price_per_hour = peewee.FloatField(null=True)  # per GPU-hour, in force at accounted_until

    class Meta:
        # a team's or an owner's runs over a time range (reports by workload) without reading the
        # others'
        indexes = ((("team", "started_at"), False), (("owner_token_id", "started_at"), False))


class UsageDay(BaseModel):
    """The ledger's sums per UTC day, kind and (team, owner, fleet, GPU model): what reports read.
    Storage cost is kind "storage"; `runs` counts the runs that started that day."""

    id = peewee.AutoField()
    day = peewee.DateField()
    kind = peewee.CharField(max_length=16)
    team = peewee.CharField(max_length=200, default="")
    project = peewee.CharField(max_length=32, default="")  # migration 0036
    owner_token_id = peewee.CharField(max_length=32)
    owner = peewee.CharField(max_length=200)
    fleet = peewee.CharField(max_length=63, default="")
    gpu_model = peewee.CharField(max_length=128, default="")
    gpu_seconds = peewee.FloatField(default=0.0)
    used_gpu_seconds = peewee.FloatField(default=0.0)
    sampled_gpu_seconds = peewee.FloatField(default=0.0)
    cost = peewee.FloatField(default=0.0)
    runs = peewee.IntegerField(default=0)

    class Meta:
        indexes = (
            (
                ("day", "kind", "team", "project", "owner_token_id", "owner", "fleet", "gpu_model"),
                True,
            ),
            (("project", "day"), False),
        )


class _UsageWorkloadSums(BaseModel):
    """The ledger's sums of one workload (kind job or instance, its id) per period: what reports
    by workload read. Storage cost counts on the instance; `runs` counts the runs that started."""

    kind = peewee.CharField(max_length=16)
    workload_id = peewee.CharField(max_length=32)
    team = peewee.CharField(max_length=200, default="")
    owner_token_id = peewee.CharField(max_length=32)
    owner = peewee.CharField(max_length=200)
    gpu_seconds = peewee.FloatField(default=0.0)
    used_gpu_seconds = peewee.FloatField(default=0.0)
    sampled_gpu_seconds = peewee.FloatField(default=0.0)
    cost = peewee.FloatField(default=0.0)
    runs = peewee.IntegerField(default=0)


class UsageWorkloadDay(_UsageWorkloadSums):
    """A workload's sums per UTC day and fleet (a report by workload over any days)."""

    id = peewee.AutoField()
    day = peewee.DateField()
    fleet = peewee.CharField(max_length=63, default="")

    class Meta:
        indexes = (
            (("day", "kind", "workload_id", "fleet"), True),
            (("fleet", "day"), False),
            (("team", "day"), False),
            (("owner_token_id", "day"), False),
            (("owner", "day"), False),
        )


class _UsageWorkloadMonthSums(_UsageWorkloadSums):
    """A workload's sums over one UTC month (`month`: its first day), with the first and last day
    of that month that it has day rows on: a report over part of the month reads the month row of
    a workload whose days all fall in the range, and adds up the day rows of one that straddles
    the range's edge (fleetd.services.accounting.usage_workloads). The ledger and migration 0049
    set both days on every row; null only in a row written by neither."""

    month = peewee.DateField()
    first_day = peewee.DateField(null=True)
    last_day = peewee.DateField(null=True)


class UsageWorkloadMonth(_UsageWorkloadMonthSums):
    """A workload's sums per UTC month, all fleets together: a month's report by workload reads its
    costliest rows straight from the (month, ..., cost) indexes."""

    id = peewee.AutoField()

    class Meta:
        indexes = (
            (("month", "kind", "workload_id"), True),
            (("month", "cost", "first_day", "last_day"), False),
            (("month", "team", "cost"), False),
            (("month", "owner_token_id", "cost"), False),
            (("month", "owner", "cost"), False),
        )


class UsageWorkloadFleetMonth(_UsageWorkloadMonthSums):
    """A workload's sums per UTC month and fleet (migration 0049): a report by workload over one
    fleet reads these as the others read UsageWorkloadMonth."""

    id = peewee.AutoField()
    fleet = peewee.CharField(max_length=63, default="")

    class Meta:
        table_name = "usage_workload_fleet_month"
        indexes = (
            (("month", "fleet", "kind", "workload_id"), True),
            (("month", "fleet", "cost", "first_day", "last_day"), False),
        )


# The workloads with day rows on more than one day of a month: those that may straddle the edge of
# a range inside it (migration 0049).
UsageWorkloadMonth.add_index(
    UsageWorkloadMonth.month,
    UsageWorkloadMonth.first_day,
    UsageWorkloadMonth.last_day,
    where=peewee.SQL("first_day < last_day"),
    name="usage_workload_month_spans",
)
UsageWorkloadFleetMonth.add_index(
    UsageWorkloadFleetMonth.month,
    UsageWorkloadFleetMonth.fleet,
    UsageWorkloadFleetMonth.first_day,
    UsageWorkloadFleetMonth.last_day,
    where=peewee.SQL("first_day < last_day"),
    name="usage_workload_fleet_month_spans",
)


class UsageMark(BaseModel):
    """A run that ended and is not in the ledger yet: written as its task ends (a requeue then
    clears the task's times, node and GPUs), read and removed by the `usage` background task."""

    id = peewee.AutoField()
    task_id = peewee.CharField(max_length=32)
    epoch = peewee.IntegerField()
    node_id = peewee.CharField(max_length=32, default="")
    gpus = JSONText(default=list)
    attempt = peewee.IntegerField(default=1)  # its job's attempt
    started_at = peewee.DateTimeField()
    ended_at = peewee.DateTimeField()

    class Meta:
        indexes = ((("task_id",), False),)  # a job's cost reads its runs' marks (migration 0030)


class StorageRecord(BaseModel):
    """An instance volume's storage cost (per GB-month at the storage price in force), as far as
    `accounted_until`; `id` is the instance's."""

    id = peewee.CharField(primary_key=True, max_length=32)
    owner = peewee.CharField(max_length=200)
    owner_token_id = peewee.CharField(max_length=32)
    team = peewee.CharField(max_length=200, default="")
    project = peewee.CharField(max_length=32, default="")  # its instance's (migration 0036)
    fleet = peewee.CharField(max_length=63, default="")
    volume_bytes = peewee.BigIntegerField(default=0)
    started_at = peewee.DateTimeField()
    ended_at = peewee.DateTimeField(null=True)
    accounted_until = peewee.DateTimeField()
    cost = peewee.FloatField(default=0.0)


class PriceChange(BaseModel):
    """A price as it was set, from `at` on: kind "gpu" (a GPU model's per GPU-hour) or "storage"
    (per GB-month, model ""); None: unpriced. The ledger integrates these piecewise."""

    id = peewee.AutoField()
    at = peewee.DateTimeField()
    kind = peewee.CharField(max_length=16)
    model = peewee.CharField(max_length=128, default="")
    price = peewee.FloatField(null=True)

    class Meta:
        indexes = ((("kind", "model", "at"), False),)


class Budget(BaseModel):
    """A team's budget per calendar month (UTC), in currency and/or GPU-hours
    (fleetd.services.accounting.budgets)."""

    team = peewee.CharField(primary_key=True, max_length=200)
    limit_cost = peewee.FloatField(null=True)
    limit_gpu_hours = peewee.FloatField(null=True)
    on_exceed = peewee.CharField(max_length=16, default="notify")  # notify, block or stop_spot
    exceeded_month = peewee.CharField(
        max_length=7, null=True
    )  # "YYYY-MM" it was last found exceeded
    updated_at = peewee.DateTimeField()
    updated_by = peewee.CharField(max_length=200, default="")


class BudgetNotice(BaseModel):
    """A threshold (50, 80, 100) of a team's budget that one month crossed: its webhook went out
    once."""

    team = peewee.CharField(max_length=200)
    month = peewee.CharField(max_length=7)
    threshold = peewee.IntegerField()
    at = peewee.DateTimeField()

    class Meta:
        primary_key = peewee.CompositeKey("team", "month", "threshold")


class ProjectBudget(BaseModel):
    """A project's budget per calendar month (UTC), in currency and/or GPU-hours: it notifies (at
    50, 80 and 100 %) and holds nothing back; a team's budget is what holds work back
    (fleetd.services.accounting.project_budgets)."""

    project = peewee.CharField(primary_key=True, max_length=32)
    limit_cost = peewee.FloatField(null=True)
    limit_gpu_hours = peewee.FloatField(null=True)
    notified_month = peewee.CharField(max_length=7, null=True)  # "YYYY-MM" of the last notice
    notified_percent = peewee.IntegerField(default=0)  # the highest threshold told that month
    updated_at = peewee.DateTimeField()
    updated_by = peewee.CharField(max_length=200, default="")

    class Meta:
        table_name = "project_budget"
