"""PostgreSQL: the inventory triggers run at commit, not at each write.

Each trigger bumps the one row of `inventory_version`, which holds that row's lock until the
transaction ends; fired at the write, every transaction that changes a node, a GPU or a fleet
held it for the rest of its work, so all of them queued behind each other across replicas (a
registration storm: dozens of registrations waiting, each holding a pooled connection). As
constraint triggers deferred to commit they take the lock at the end, for the commit alone. The
version and the changed nodes still commit with the rows, in the order of the versions. SQLite
has one writer at a time anyway: its triggers stay as they are."""
from peewee import *

from fleetd.inventory_columns import watched

# table -> (the UPDATE its trigger fires on, the function: 0013's for node and GPU rows, 0006's for fleets)
TRIGGERS = (
    ("node", f"UPDATE OF {watched('node', 27)}", "note_inventory_change"),
    ("gpu", "UPDATE", "note_inventory_change"),
    ("fleet", f"UPDATE OF {watched('fleet', 27)}", "bump_inventory_version"),
)


def up(migrator, db):
    if not isinstance(db, PostgresqlDatabase):
        return
    for table, update, function in TRIGGERS:
        db.execute_sql(f"DROP TRIGGER {table}_inventory ON {table}")
        db.execute_sql(f"CREATE CONSTRAINT TRIGGER {table}_inventory AFTER INSERT OR DELETE OR {update} ON {table} "
                       f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {function}()")


def down(migrator, db):
    if not isinstance(db, PostgresqlDatabase):
        return
    for table, update, function in TRIGGERS:
        level = "STATEMENT" if table == "fleet" else "ROW"
        db.execute_sql(f"DROP TRIGGER {table}_inventory ON {table}")
        db.execute_sql(f"CREATE TRIGGER {table}_inventory AFTER INSERT OR DELETE OR {update} ON {table} "
                       f"FOR EACH {level} EXECUTE FUNCTION {function}()")
