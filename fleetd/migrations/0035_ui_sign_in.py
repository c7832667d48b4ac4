"""Signing in to the admin UI with an identity provider (the authorization code flow with PKCE):
a UI session may act as a user's session (`ui_session.auth_session_id`) instead of an API token
(`token_id` becomes nullable), and `sign_in_attempt` holds a browser's sign-in while it is at the
provider (its state's hash, nonce, PKCE verifier; ten minutes at most). Going down drops the
attempts and the UI sessions of users' sessions."""
from peewee import *


def up(migrator, db):
    class SignInAttempt(Model):
        id = CharField(primary_key=True, max_length=64)
        provider = CharField(max_length=64)
        nonce = CharField(max_length=64)
        code_verifier = CharField(max_length=128)
        browser_hash = CharField(max_length=64)
        redirect_uri = CharField(max_length=1000)
        next_path = CharField(max_length=1000, null=True)
        created_at = DateTimeField()
        expires_at = DateTimeField(index=True)

        class Meta:
            database = db
            table_name = 'sign_in_attempt'

    db.create_tables([SignInAttempt])
    migrator.migrate(
        migrator.add_column(
            'ui_session', 'auth_session_id', CharField(max_length=32, null=True, index=True)
        ),
        migrator.drop_not_null('ui_session', 'token_id'),
    )


def down(migrator, db):
    db.execute_sql('DELETE FROM ui_session WHERE token_id IS NULL')
    migrator.migrate(
        migrator.drop_index('ui_session', 'ui_session_auth_session_id'),
        migrator.add_not_null('ui_session', 'token_id'),
        migrator.drop_column('ui_session', 'auth_session_id'),
    )
    db.execute_sql('DROP TABLE sign_in_attempt')
