"""Artifact uploaders (artifacts are readable by who uploaded them) and server-side UI sessions."""
from peewee import *


def up(migrator, db):
    class ArtifactUpload(Model):
        sha256 = CharField(max_length=64)
        token_id = CharField(max_length=32)
        uploaded_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'artifact_upload'
            primary_key = CompositeKey('sha256', 'token_id')

    class UiSession(Model):
        id = CharField(primary_key=True, max_length=64)
        token_id = CharField(max_length=32, index=True)
        created_at = DateTimeField()
        expires_at = DateTimeField(index=True)

        class Meta:
            database = db
            table_name = 'ui_session'

    db.create_tables([ArtifactUpload, UiSession])
    # Artifacts uploaded before this migration stay readable by the token(s) of their uploader's name.
    db.execute_sql("INSERT INTO artifact_upload (sha256, token_id, uploaded_at) "
                   "SELECT a.sha256, t.id, a.created_at FROM artifact a JOIN api_token t ON 'token:' || t.name = a.created_by")


def down(migrator, db):
    migrator.migrate(migrator.drop_table('ui_session'))
    migrator.migrate(migrator.drop_table('artifact_upload'))
