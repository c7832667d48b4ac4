"""Dynamic MIG (issue 50): per GPU, `mig_target`, the layout fleetd asked its agent to make and
has not seen yet ({plan, instances: [{profile, start, size}]}; null: none pending);
`mig_changed_at`, when fleetd last planned a change (no other within the fleet's settle time); and
`mig_blocked`, why its last repartition failed ('' when it did not): a blocked GPU takes no work
and is not repartitioned until an operator clears it. The GPU update trigger watches every column
already. Plain ADD/DROP COLUMN, as 0038."""

from peewee import *


def up(migrator, db):
    when = "TIMESTAMP" if isinstance(db, PostgresqlDatabase) else "DATETIME"  # as peewee makes it
    db.execute_sql("ALTER TABLE gpu ADD COLUMN mig_target TEXT")
    db.execute_sql(f"ALTER TABLE gpu ADD COLUMN mig_changed_at {when}")
    db.execute_sql("ALTER TABLE gpu ADD COLUMN mig_blocked TEXT NOT NULL DEFAULT ''")


def down(migrator, db):
    db.execute_sql("ALTER TABLE gpu DROP COLUMN mig_blocked")
    db.execute_sql("ALTER TABLE gpu DROP COLUMN mig_changed_at")
    db.execute_sql("ALTER TABLE gpu DROP COLUMN mig_target")
