"""Team budgets (issue 34): `budget`, a team's limit per calendar month (UTC) in currency and/or
GPU-hours, what happens at 100 % (`on_exceed`) and the month it was last found exceeded
(`exceeded_month`, 'YYYY-MM'); `budget_notice`, each threshold (50, 80, 100 %) a team's month
crossed, written once with its `budget.threshold` event, so that each is delivered once."""
from peewee import *


def up(migrator, db):
    class Budget(Model):
        team = CharField(primary_key=True, max_length=200)
        limit_cost = FloatField(null=True)
        limit_gpu_hours = FloatField(null=True)
        on_exceed = CharField(max_length=16, default='notify')
        exceeded_month = CharField(max_length=7, null=True)
        updated_at = DateTimeField()
        updated_by = CharField(max_length=200, default='')

        class Meta:
            database = db
            table_name = 'budget'

    class BudgetNotice(Model):
        team = CharField(max_length=200)
        month = CharField(max_length=7)
        threshold = IntegerField()
        at = DateTimeField()

        class Meta:
            database = db
            table_name = 'budget_notice'
            primary_key = CompositeKey('team', 'month', 'threshold')

    db.create_tables([Budget, BudgetNotice])


def down(migrator, db):
    migrator.migrate(migrator.drop_table('budget_notice'))
    migrator.migrate(migrator.drop_table('budget'))
