"""Budgets per project (issue 45): a project's monthly limits in currency and/or GPU-hours, which
notify its members and admins at 50, 80 and 100 %. Going down drops the table."""
from peewee import *


def up(migrator, db):
    class ProjectBudget(Model):
        project = CharField(primary_key=True, max_length=32)
        limit_cost = FloatField(null=True)
        limit_gpu_hours = FloatField(null=True)
        notified_month = CharField(max_length=7, null=True)
        notified_percent = IntegerField(default=0)
        updated_at = DateTimeField()
        updated_by = CharField(max_length=200, default='')

        class Meta:
            database = db
            table_name = 'project_budget'

    db.create_tables([ProjectBudget])


def down(migrator, db):
    db.execute_sql('DROP TABLE project_budget')
