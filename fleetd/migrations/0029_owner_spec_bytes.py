"""Per-owner stored spec bytes (issue 44): `owner_spec_bytes` keeps, per API token, the bytes of
the `spec` column of its jobs, runs of instances and instances, ended ones included until the gc
deletes them, so that the `max_stored_spec_bytes` limit is checked at a submit by reading one row,
never by summing the owner's rows. It is filled here from the rows already stored (a spec is
stored as ASCII JSON, so its length in characters is its length in bytes). Going down drops it."""
from peewee import *


def up(migrator, db):
    class OwnerSpecBytes(Model):
        token_id = CharField(primary_key=True, max_length=32)
        bytes = BigIntegerField(default=0)

        class Meta:
            database = db
            table_name = 'owner_spec_bytes'

    db.create_tables([OwnerSpecBytes])
    db.execute_sql(
        'INSERT INTO owner_spec_bytes (token_id, bytes) '
        'SELECT owner_token_id, SUM(LENGTH(spec)) FROM '
        '(SELECT owner_token_id, spec FROM job UNION ALL SELECT owner_token_id, spec FROM instance) AS stored '
        'WHERE owner_token_id IS NOT NULL GROUP BY owner_token_id')


def down(migrator, db):
    db.execute_sql('DROP TABLE owner_spec_bytes')
