"""An inventory version the database bumps on every change to what placement reads of nodes,
GPUs and fleets, so the scheduler keeps them in memory and reads them again only when it moved."""
from peewee import *

from fleetd.inventory_columns import watched

# Node and fleet columns placement reads (fleetd.inventory_columns); every GPU column counts.
TABLES = (("node", watched("node", 6)), ("gpu", None), ("fleet", watched("fleet", 6)))


def up(migrator, db):
    class InventoryVersion(Model):
        id = IntegerField(primary_key=True)
        version = BigIntegerField(default=0)

        class Meta:
            database = db
            table_name = 'inventory_version'

    db.create_tables([InventoryVersion])
    db.execute_sql("INSERT INTO inventory_version (id, version) VALUES (1, 0)")
    bump = "UPDATE inventory_version SET version = version + 1 WHERE id = 1"
    if isinstance(db, PostgresqlDatabase):
        db.execute_sql(f"CREATE FUNCTION bump_inventory_version() RETURNS trigger AS $$ "
                       f"BEGIN {bump}; RETURN NULL; END $$ LANGUAGE plpgsql")
        for table, columns in TABLES:
            update = f"UPDATE OF {columns}" if columns else "UPDATE"
            db.execute_sql(f"CREATE TRIGGER {table}_inventory AFTER INSERT OR DELETE OR {update} ON {table} "
                           f"FOR EACH STATEMENT EXECUTE FUNCTION bump_inventory_version()")
        return
    for table, columns in TABLES:
        for event in ("INSERT", "DELETE", f"UPDATE OF {columns}" if columns else "UPDATE"):
            name = f"{table}_inventory_{event.split()[0].lower()}"
            db.execute_sql(f"CREATE TRIGGER {name} AFTER {event} ON {table} BEGIN {bump}; END")


def down(migrator, db):
    if isinstance(db, PostgresqlDatabase):
        for table, _ in TABLES:
            db.execute_sql(f"DROP TRIGGER {table}_inventory ON {table}")
        db.execute_sql("DROP FUNCTION bump_inventory_version()")
    else:
        for table, _ in TABLES:
            for event in ("insert", "delete", "update"):
                db.execute_sql(f"DROP TRIGGER {table}_inventory_{event}")
    migrator.migrate(migrator.drop_table('inventory_version'))
