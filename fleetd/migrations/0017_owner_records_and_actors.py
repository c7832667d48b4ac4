"""Artifacts' names per owner, and actors that name one token.

- An artifact's bytes are stored once (`artifact`: sha256, size, created_at), but its name and kind
  are each uploader's own (`artifact_upload.name`, `.kind`): before, the first uploader's name and
  kind were shown to every later uploader of the same bytes. Existing names go to the first
  uploader's record (the earliest upload, which made the artifact); later uploaders, whose own names
  were never kept, get the sha256 as the name and no kind.
- `event.actor_token_id`: the id of the API token that caused an event (`actor` keeps
  `token:<name>`).
- Token names become single-line printable text, unique among live tokens (neither revoked nor
  expired). A name that is not such text has each run of refused characters replaced by one space
  (`token` if nothing is left); a live token whose name an older live token already has gets the
  first suffix -2, -3, ... that no live token has. Each rename is recorded as an event `token.renamed` of subject
  `token/<id>`, by fleetd. Going down keeps the new names.
"""
import datetime
import logging
import re

from peewee import *

log = logging.getLogger("fleetd.migrations")
NAME_MAX = 200
# The characters a token name may not hold (fleetd.credentials: control, invisible and non-ASCII
# space characters), copied here so that this migration keeps its meaning if that rule changes.
REFUSED = re.compile("[\u0000-\u001f\u007f-\u00a0\u00ad\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u206f"
                     "\u3000\ufeff]+")
FIRST_UPLOAD = ("NOT EXISTS (SELECT 1 FROM artifact_upload o WHERE o.sha256 = artifact_upload.sha256 AND "
                "(o.uploaded_at < artifact_upload.uploaded_at OR (o.uploaded_at = artifact_upload.uploaded_at "
                "AND o.token_id < artifact_upload.token_id)))")


def _models(db):
    class ApiToken(Model):
        id = CharField(primary_key=True, max_length=32)
        name = CharField(max_length=200)
        created_at = DateTimeField()
        expires_at = DateTimeField(null=True)
        revoked_at = DateTimeField(null=True)

        class Meta:
            database = db
            table_name = 'api_token'

    class Event(Model):
        id = AutoField()
        at = DateTimeField()
        kind = CharField(max_length=64)
        subject_type = CharField(max_length=16)
        subject_id = CharField(max_length=64)
        reason = TextField(default="")
        actor = CharField(max_length=200, default="fleetd")

        class Meta:
            database = db
            table_name = 'event'

    return ApiToken, Event


def _clean(name):
    return REFUSED.sub(" ", name).strip()[:NAME_MAX].strip() or "token"


def _suffixed(name, taken):
    """`name`, or name-2, name-3, ... : the first that is not taken (bounded by the number taken)."""
    if name not in taken:
        return name
    for n in range(2, len(taken) + 3):
        tail = f"-{n}"
        candidate = name[:NAME_MAX - len(tail)] + tail
        if candidate not in taken:
            return candidate
    raise AssertionError("unreachable: fewer names are taken than suffixes tried")


def _rename_tokens(db):
    ApiToken, Event = _models(db)
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    tokens = list(ApiToken.select().order_by(ApiToken.created_at, ApiToken.id))
    clean = {token.id: _clean(token.name) for token in tokens}
    live = [t for t in tokens if t.revoked_at is None and (t.expires_at is None or t.expires_at > now)]
    holders = {}  # each name stays with its oldest live holder; the others get a suffix free among all
    for token in live:
        holders.setdefault(clean[token.id], token.id)
    taken = set(holders)
    for token in live:
        if holders[clean[token.id]] != token.id:
            clean[token.id] = _suffixed(clean[token.id], taken)
            taken.add(clean[token.id])
    renames = [(t.id, t.name, clean[t.id]) for t in tokens if clean[t.id] != t.name]
    for token_id, old, new in renames:
        log.warning("migration 0017: API token %s renamed from %r to %r", token_id, old, new)
        ApiToken.update(name=new).where(ApiToken.id == token_id).execute()
        Event.create(at=now, kind="token.renamed", subject_type="token", subject_id=token_id, actor="fleetd",
                     reason=f"renamed from {old!r} to {new!r} by migration 0017: a token name is single-line "
                            f"printable text, unique among live tokens")


def up(migrator, db):
    migrator.migrate(migrator.add_column('event', 'actor_token_id', CharField(max_length=32, null=True)))
    # NOT NULL with a default in the database itself: SQLite's migrator would otherwise rebuild the table.
    db.execute_sql("ALTER TABLE artifact_upload ADD COLUMN name VARCHAR(255) NOT NULL DEFAULT ''")
    db.execute_sql("ALTER TABLE artifact_upload ADD COLUMN kind VARCHAR(64) NOT NULL DEFAULT ''")
    db.execute_sql("UPDATE artifact_upload SET name = sha256")
    db.execute_sql("UPDATE artifact_upload SET "  # nosec B608  # FIRST_UPLOAD is the migration's own SQL
                   "name = (SELECT a.name FROM artifact a WHERE a.sha256 = artifact_upload.sha256), "
                   "kind = (SELECT a.kind FROM artifact a WHERE a.sha256 = artifact_upload.sha256) "
                   "WHERE EXISTS (SELECT 1 FROM artifact a WHERE a.sha256 = artifact_upload.sha256) AND " + FIRST_UPLOAD)
    migrator.migrate(
        migrator.drop_column('artifact', 'name'),
        migrator.drop_column('artifact', 'kind'),
        migrator.drop_column('artifact', 'created_by'),
    )
    _rename_tokens(db)


def down(migrator, db):
    migrator.migrate(
        migrator.add_column('artifact', 'name', CharField(max_length=255, default="")),
        migrator.add_column('artifact', 'kind', CharField(max_length=64, default="")),
        migrator.add_column('artifact', 'created_by', CharField(max_length=200, default="")),
    )
    db.execute_sql("UPDATE artifact SET "  # nosec B608  # FIRST_UPLOAD is the migration's own SQL
                   "name = COALESCE((SELECT name FROM artifact_upload WHERE artifact_upload.sha256 = artifact.sha256 "
                   "AND " + FIRST_UPLOAD + "), sha256), "  # nosec B608  # FIRST_UPLOAD is the migration's own SQL
                   "kind = COALESCE((SELECT kind FROM artifact_upload WHERE artifact_upload.sha256 = artifact.sha256 "
                   "AND " + FIRST_UPLOAD + "), '')")
    migrator.migrate(
        migrator.drop_column('artifact_upload', 'kind'),
        migrator.drop_column('artifact_upload', 'name'),
        migrator.drop_column('event', 'actor_token_id'),
    )
