"""Instance names are handles (`fleetd instance show web`): unique among one owner's instances that
are not deleted, which a partial unique index enforces. Duplicates from before are renamed first:
the oldest (by created_at, then id) keeps its name, each later one becomes `name-2`, `name-3`, ...
(the first suffix that is free), and an `instance.renamed` event records each rename. Going down
drops the index and keeps the new names."""
import collections
import datetime

from peewee import *

INDEX = 'instance_owner_name_live'
MAX_NAME = 200


def _free_name(name, taken):
    """`name-N` with the smallest N >= 2 not in `taken`, cut to fit the column."""
    for n in range(2, len(taken) + 3):
        suffix = f'-{n}'
        candidate = name[:MAX_NAME - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
    raise AssertionError('unreachable: len(taken) + 1 suffixes cannot all be taken')


def up(migrator, db):
    p = db.param
    rows = db.execute_sql("SELECT id, owner_token_id, name FROM instance WHERE state != 'deleted' "
                          "ORDER BY owner_token_id, created_at, id").fetchall()
    taken = collections.defaultdict(set)  # owner token -> the live names it holds
    for _, owner, name in rows:
        taken[owner].add(name)
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    kept = set()
    for instance_id, owner, name in rows:
        if (owner, name) not in kept:
            kept.add((owner, name))  # the oldest of its name keeps it
            continue
        new = _free_name(name, taken[owner])
        taken[owner].add(new)
        db.execute_sql(f"UPDATE instance SET name = {p} WHERE id = {p}", (new, instance_id))  # nosec B608  # {p} is the parameter marker
        db.execute_sql(f"INSERT INTO event (at, kind, subject_type, subject_id, from_status, to_status, reason, "  # nosec B608  # {p} is the parameter marker
                       f"actor) VALUES ({p}, 'instance.renamed', 'instance', {p}, NULL, NULL, {p}, 'fleetd')",
                       (now, instance_id, f"renamed from {name!r} to {new!r}: instance names are now unique "
                                          "among an owner's instances (an older one has this name)"))
    migrator.migrate(migrator.add_index('instance', ('owner_token_id', 'name'), True,
                                        where=SQL("state != 'deleted'"), name=INDEX))


def down(migrator, db):
    migrator.migrate(migrator.drop_index('instance', INDEX))
