"""Per-owner limits: what an admin set on an API token (`api_token.limits`, JSON; a limit it does not
name is the setting's default), and the indexes that keep their checks cheap: an owner's active jobs
are counted at every submit from `job_owner_state` (jobs that are not runs of instances, by owner and
state), never by reading its ended ones, and its stored artifact bytes are summed over its own uploads
(`artifact_upload_token_id`). Going down drops them; no limit was ever stored elsewhere."""
from peewee import *

JOB_INDEX = 'job_owner_state'
UPLOAD_INDEX = 'artifact_upload_token_id'


def up(migrator, db):
    migrator.migrate(
        migrator.add_column('api_token', 'limits', TextField(null=True)),
        migrator.add_index('job', ('owner_token_id', 'state'), False, where=SQL('instance_id IS NULL'),
                           name=JOB_INDEX),
        migrator.add_index('artifact_upload', ('token_id',), False, name=UPLOAD_INDEX),
    )


def down(migrator, db):
    migrator.migrate(
        migrator.drop_index('artifact_upload', UPLOAD_INDEX),
        migrator.drop_index('job', JOB_INDEX),
        migrator.drop_column('api_token', 'limits'),
    )
