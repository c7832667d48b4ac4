"""Share links and notification feeds: `share` holds read-only links to jobs (only the SHA-256 of
each link's token), `notification` each owner's feed (jobs that ended, budget alerts). Both start
empty: nothing before them is rewritten. Going down drops them."""
from peewee import *


def up(migrator, db):
    class Share(Model):
        id = CharField(primary_key=True, max_length=32)
        token_hash = CharField(max_length=64, unique=True)
        job_id = CharField(max_length=32, index=True)
        created_by = CharField(max_length=200)
        created_at = DateTimeField()
        expires_at = DateTimeField(null=True)
        revoked_at = DateTimeField(null=True)

        class Meta:
            database = db
            table_name = 'share'

    class Notification(Model):
        id = AutoField()
        owner_id = CharField(max_length=32)
        at = DateTimeField(index=True)
        kind = CharField(max_length=32)
        subject_kind = CharField(max_length=16)
        subject_id = CharField(max_length=200)
        subject_name = CharField(max_length=200)
        text = TextField()
        read = BooleanField(default=False)

        class Meta:
            database = db
            table_name = 'notification'
            indexes = ((('owner_id', 'id'), False),)

    db.create_tables([Share, Notification])


def down(migrator, db):
    db.execute_sql('DROP TABLE notification')
    db.execute_sql('DROP TABLE share')
