"""Schemas of usage reports, idle-held GPUs, budgets and the storage price."""

import datetime as dt

from marshmallow import Schema, ValidationError, fields, validate

from fleetd.schemas.common import Text, Time
from fleetd.services.accounting.budgets import ON_EXCEED
from fleetd.services.accounting.usage import GROUP_BY

MAX_MONEY = 1e12


class Day(fields.Field):
    """A UTC day: YYYY-MM-DD, or an RFC 3339 time (its UTC day)."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, str) or len(value) > 40 or "\x00" in value:
            raise ValidationError("a date (YYYY-MM-DD) or an RFC 3339 time")
        text = value.strip()
        try:
            if len(text) == 10:
                return dt.date.fromisoformat(text)
            parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValidationError("a date (YYYY-MM-DD) or an RFC 3339 time") from None
        if parsed.tzinfo is not None:
            parsed = parsed.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return parsed.date()


class UsageQuerySchema(Schema):
    from_ = Day(
        data_key="from",
        load_default=None,
        metadata={
            "description": "first UTC day (YYYY-MM-DD or a time); default: the first of this month"
        },
    )
    to = Day(load_default=None, metadata={"description": "last UTC day, included; default: today"})
    group_by = fields.String(validate=validate.OneOf(GROUP_BY), load_default="team")
    team = Text(max_length=200, load_default=None)
    owner = Text(max_length=200, load_default=None)
    fleet = Text(max_length=63, load_default=None)


class UsageFiguresSchema(Schema):
    gpu_hours_allocated = fields.Float()
    gpu_hours_used = fields.Float(
        allow_none=True,
        metadata={
            "description": (
                "utilisation-weighted, over the part with GPU samples; null where none came"
            )
        },
    )
    efficiency = fields.Float(
        allow_none=True, metadata={"description": "used / allocated where sampled, 0 to 1"}
    )
    cost = fields.Float()
    runs = fields.Integer(metadata={"description": "runs that started in the range"})


class UsageRowSchema(UsageFiguresSchema):
    group = fields.String(
        allow_none=True,
        metadata={
            "description": (
                "the team, owner, fleet, GPU model, day (YYYY-MM-DD) or workload (kind/id); null: "
                "none"
            )
        },
    )


class UsageReportSchema(Schema):
    from_ = fields.String(data_key="from", attribute="from")
    to = fields.String()
    group_by = fields.String()
    rows = fields.List(fields.Nested(UsageRowSchema))
    totals = fields.Nested(UsageFiguresSchema)


class IdleQuerySchema(Schema):
    min_minutes = fields.Float(validate=validate.Range(min=1, max=24 * 60), load_default=30)
    below_percent = fields.Float(validate=validate.Range(min=0, max=100), load_default=10)


class IdleWorkloadSchema(Schema):
    kind = fields.String()
    id = fields.String()
    name = fields.String()
    owner = fields.String()
    team = fields.String(allow_none=True)
    gpus = fields.Float()
    idle_minutes = fields.Float()
    idle_since = fields.String()
    cost_so_far = fields.Float()


class IdleListSchema(Schema):
    items = fields.List(fields.Nested(IdleWorkloadSchema))


class BudgetUpdateSchema(Schema):
    limit_cost = fields.Float(
        validate=validate.Range(min=0, max=MAX_MONEY), load_default=None, allow_none=True
    )
    limit_gpu_hours = fields.Float(
        validate=validate.Range(min=0, max=MAX_MONEY), load_default=None, allow_none=True
    )
    on_exceed = fields.String(validate=validate.OneOf(ON_EXCEED), load_default="notify")


class _BudgetFigures(Schema):
    period = fields.String()
    month = fields.String()
    limit_cost = fields.Float(allow_none=True)
    limit_gpu_hours = fields.Float(allow_none=True)
    on_exceed = fields.String()
    used_cost = fields.Float()
    used_gpu_hours = fields.Float()
    used_percent = fields.Float()
    exceeded = fields.Boolean()
    updated_at = Time()
    updated_by = fields.String()


class BudgetSchema(_BudgetFigures):
    team = fields.String()


class BudgetListSchema(Schema):
    items = fields.List(fields.Nested(BudgetSchema))
    projects = fields.List(
        fields.Nested(lambda: ProjectBudgetSchema()),
        metadata={"description": "project budgets (they notify; a team's holds work back)"},
    )


class ProjectBudgetUpdateSchema(BudgetUpdateSchema):
    on_exceed = fields.String(
        validate=validate.OneOf(["notify"]),
        load_default="notify",
        metadata={"description": "notify: a project's budget tells; its team's holds work back"},
    )


class ProjectBudgetSchema(_BudgetFigures):
    project = fields.String()


class StoragePriceUpdateSchema(Schema):
    per_gb_month = fields.Float(
        required=True, allow_none=True, validate=validate.Range(min=0, max=MAX_MONEY)
    )


class StoragePriceSchema(Schema):
    per_gb_month = fields.Float(allow_none=True)
    unit_bytes = fields.Integer(metadata={"description": "bytes in a GB as priced (10^9)"})
