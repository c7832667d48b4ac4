"""What each task on a fleet's nodes gets unless its spec says otherwise (issue 44): `task_pids_max`
(the most processes and threads a task may hold, 4096), `task_memory_default_bytes` (the host memory
bound of a task that sets no `memory_bytes`, 32 GiB) and `task_path` (the PATH a task starts with,
never the agent's own). Existing fleets get the defaults. Each column is NOT NULL with its default in
the database itself: on SQLite the migrator would otherwise rebuild the fleet table, which drops its
inventory triggers (see 0016)."""

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
COLUMNS = (
    ("task_pids_max", "INTEGER NOT NULL DEFAULT 4096"),
    ("task_memory_default_bytes", f"BIGINT NOT NULL DEFAULT {32 * 1024 ** 3}"),
    ("task_path", f"TEXT NOT NULL DEFAULT '{PATH}'"),
)


def up(migrator, db):
    for column, definition in COLUMNS:
        db.execute_sql(f"ALTER TABLE fleet ADD COLUMN {column} {definition}")


def down(migrator, db):
    migrator.migrate(*(migrator.drop_column('fleet', column) for column, _ in reversed(COLUMNS)))
