"""People and projects (issue 45): users own tokens and sessions; projects, inside teams, hold work.

Every API token becomes owned by a user of its name: the user takes the id of the newest token of
that name, so the work, usage, uid and stored spec bytes recorded under that token's id are the
user's without a rewrite. Work of older tokens of the same name (revoked or expired ones) is moved
to that user. Each team named by a token, job or instance gets a project of its name, and work
without a team the project `default`; every job and instance is put in its team's project and
names its user. Nothing is deleted; going down drops what was added."""
import json
import re

from peewee import *

_KEY = re.compile(r'^[a-z][a-z0-9-]{1,31}$')
_LOGIN = re.compile(r'^[a-z_][a-z0-9_.-]{0,63}$')


def _slug(text, pattern, fallback, taken, size):
    slug = re.sub(r'[^a-z0-9-]+', '-', (text or '').lower()).strip('-')[:size]
    if not slug or not slug[0].isalpha():
        slug = (fallback + '-' + slug)[:size].strip('-')
    candidate, n = slug, 1
    while candidate in taken or not pattern.match(candidate):
        n += 1
        candidate = f'{slug[:size - len(str(n)) - 1]}-{n}'
    taken.add(candidate)
    return candidate


def up(migrator, db):
    class User(Model):
        id = CharField(primary_key=True, max_length=32)
        login = CharField(max_length=64, unique=True)
        display_name = CharField(max_length=200, default='')
        email = CharField(max_length=320, null=True)
        active = BooleanField(default=True)
        role = CharField(max_length=20)
        team = CharField(max_length=200, null=True)
        default_project = CharField(max_length=32, null=True)
        unix_user = CharField(max_length=32, null=True)
        posix = TextField(null=True)
        limits = TextField(null=True)
        source = CharField(max_length=8)
        provider = CharField(max_length=64, null=True)
        subject = CharField(max_length=255, null=True)
        scim_id = CharField(max_length=64, null=True, unique=True)
        external_id = CharField(max_length=255, null=True)
        groups = TextField(null=True)
        created_at = DateTimeField()
        deactivated_at = DateTimeField(null=True)

        class Meta:
            database = db
            table_name = 'user'
            indexes = ((('provider', 'subject'), True),)

    class Project(Model):
        key = CharField(primary_key=True, max_length=32)
        name = CharField(max_length=200)
        display_name = CharField(max_length=200)
        team = CharField(max_length=200, null=True)
        description = TextField(default='')
        created_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'project'

    class ProjectMember(Model):
        project = CharField(max_length=32)
        user_id = CharField(max_length=32, index=True)
        role = CharField(max_length=8)
        bound = BooleanField(default=False)

        class Meta:
            database = db
            table_name = 'project_member'
            primary_key = CompositeKey('project', 'user_id')

    class AuthSession(Model):
        id = CharField(primary_key=True, max_length=32)
        user_id = CharField(max_length=32, index=True)
        provider = CharField(max_length=64, null=True)
        token_hash = CharField(max_length=64)
        refresh_hash = CharField(max_length=64, unique=True)
        created_at = DateTimeField()
        expires_at = DateTimeField()
        refresh_expires_at = DateTimeField(index=True)
        ended_at = DateTimeField(null=True)
        upstream_refresh = TextField(null=True)

        class Meta:
            database = db
            table_name = 'auth_session'

    class AuthProvider(Model):
        name = CharField(primary_key=True, max_length=64)
        kind = CharField(max_length=8)
        issuer = CharField(max_length=500)
        client_id = CharField(max_length=255, null=True)
        client_secret = CharField(max_length=500, null=True)
        audience = CharField(max_length=255, null=True)
        jwks_url = CharField(max_length=500, null=True)
        scopes = TextField(null=True)
        claims = TextField(null=True)
        created_at = DateTimeField()

        class Meta:
            database = db
            table_name = 'auth_provider'

    db.create_tables([User, Project, ProjectMember, AuthSession, AuthProvider])
    migrator.migrate(
        migrator.add_column('api_token', 'user_id', CharField(max_length=32, null=True)),
        migrator.add_column('api_token', 'project', CharField(max_length=32, null=True)),
        migrator.add_column('job', 'project', CharField(max_length=32, null=True)),
        migrator.add_column('job', 'user_login', CharField(max_length=64, null=True)),
        migrator.add_column('instance', 'project', CharField(max_length=32, null=True)),
        migrator.add_column('instance', 'user_login', CharField(max_length=64, null=True)),
        migrator.add_index('api_token', ('user_id',), False),
        migrator.add_index('job', ('project',), False),
        migrator.add_index('instance', ('project',), False),
    )
    now = db.execute_sql('SELECT CURRENT_TIMESTAMP').fetchone()[0]
    token = Table('api_token', ('id', 'name', 'role', 'team', 'unix_user', 'limits', 'revoked_at', 'created_at',
                                'user_id')).bind(db)
    work = {name: Table(name, ('id', 'name', 'state', 'team', 'owner_token_id', 'project', 'user_login')).bind(db)
            for name in ('job', 'instance')}

    # Projects: one per team any token or work names, and `default` for work without a team.
    teams = set()
    for table in (token, *work.values()):
        teams.update(r[0] for r in table.select(table.team).distinct().where(table.team.is_null(False)).tuples())
    keys = {'default'}
    project_of = {None: 'default'}
    Project.insert(key='default', name='default', display_name='Default', team=None, created_at=now).execute()
    for team in sorted(teams):
        project_of[team] = key = _slug(team, _KEY, 'team', keys, 32)
        Project.insert(key=key, name=team, display_name=team, team=team, created_at=now).execute()

    # Users: one per token name, with the id of its newest token (a live one first).
    tokens = list(token.select(token.id, token.name, token.role, token.team, token.unix_user, token.limits,
                               token.revoked_at).order_by(token.created_at, token.id).tuples())
    newest = {}
    for row in tokens:
        held = newest.get(row[1])
        if held is None or row[6] is None or held[6] is not None:
            newest[row[1]] = row
    logins = set()
    user_of_name = {}
    for name, (token_id, _, role, team, unix_user, limits, _) in sorted(newest.items()):
        login = _slug(name.replace(' ', '-').replace('_', '-'), _LOGIN, 'user', logins, 64)
        user_of_name[name] = (token_id, login)
        User.insert(id=token_id, login=login, display_name=name, role=role, team=team,
                    default_project=project_of.get(team, 'default'), unix_user=unix_user,
                    limits=limits, source='token', created_at=now).execute()
        ProjectMember.insert(project=project_of.get(team, 'default'), user_id=token_id, role='member').execute()
    for token_id, name, *_ in tokens:
        user_id, login = user_of_name[name]
        token.update(user_id=user_id).where(token.id == token_id).execute()
        if user_id != token_id:  # an older token of the name: its work becomes the user's
            _move_work(work, token_id, user_id)

    # Work: its team's project, its owner's login.
    for team, key in project_of.items():
        for table in work.values():
            table.update(project=key).where(table.team.is_null() if team is None else table.team == team).execute()
    for name, (user_id, login) in user_of_name.items():
        for table in work.values():
            table.update(user_login=login).where(table.owner_token_id == user_id).execute()


def _move_work(work, token_id, user_id):
    """The jobs and instances of an older token of a user's name become the user's; an instance whose
    name the user's own live instance already has is renamed `<name>-<its id's end>` (names are unique
    among one owner's live instances)."""
    job, instance = work['job'], work['instance']
    job.update(owner_token_id=user_id).where(job.owner_token_id == token_id).execute()
    rows = list(instance.select(instance.id, instance.name, instance.state)
                .where(instance.owner_token_id == token_id).tuples())
    for instance_id, name, state in rows:
        taken = instance.select(instance.id).where((instance.owner_token_id == user_id) & (instance.name == name)
                                                   & (instance.state != 'deleted')).exists()
        if state != 'deleted' and taken:
            name = f'{name[:200 - 7]}-{instance_id[-6:]}'
        instance.update(owner_token_id=user_id, name=name).where(instance.id == instance_id).execute()


def down(migrator, db):
    migrator.migrate(
        migrator.drop_index('api_token', 'apitoken_user_id'),
        migrator.drop_index('job', 'job_project'),
        migrator.drop_index('instance', 'instance_project'),
        migrator.drop_column('api_token', 'user_id'),
        migrator.drop_column('api_token', 'project'),
        migrator.drop_column('job', 'project'),
        migrator.drop_column('job', 'user_login'),
        migrator.drop_column('instance', 'project'),
        migrator.drop_column('instance', 'user_login'),
    )
    for table in ('auth_provider', 'auth_session', 'project_member', 'project', '"user"'):
        db.execute_sql(f'DROP TABLE {table}')
