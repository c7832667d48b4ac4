"""The operator's cordon in a field of its own (issue 49): `node.cordon`, {reason, at, actor} while
an operator's cordon holds, so that the reasons fleetd gives the node meanwhile (an upgrade, a
validation) never hide it. Nodes cordoned before keep their status; their reason stays in
status_reason. Plain ADD/DROP COLUMN: the SQLite migrator's table rebuild would drop the node
table's inventory triggers (see 0016)."""
from peewee import *


def up(migrator, db):
    db.execute_sql('ALTER TABLE node ADD COLUMN cordon TEXT')


def down(migrator, db):
    db.execute_sql('ALTER TABLE node DROP COLUMN cordon')
