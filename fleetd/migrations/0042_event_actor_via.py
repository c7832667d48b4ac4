"""How an event's actor authenticated (issue 49): `event.actor_via`, token:<name> for an API token
(a user's own token too, whose actor is user:<login>), session for a user's signed-in session, jwt
for a workload's JWT; null for nodes, join tokens and fleetd. A tool that provisions hosts may act
with a token of its own or with its operator's session: its records say which. Events written before
keep null. Plain ADD/DROP COLUMN, as 0038."""
from peewee import *


def up(migrator, db):
    db.execute_sql('ALTER TABLE event ADD COLUMN actor_via VARCHAR(255)')


def down(migrator, db):
    db.execute_sql('ALTER TABLE event DROP COLUMN actor_via')
