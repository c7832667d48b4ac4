"""Who caused each event (`event.actor`: token:<name>, node:<id> or fleetd)."""
from peewee import *


def up(migrator, db):
    migrator.migrate(migrator.add_column('event', 'actor', CharField(max_length=200, default='fleetd')))


def down(migrator, db):
    migrator.migrate(migrator.drop_column('event', 'actor'))
