"""Nodes remember the SHA-256 of the offline bundle their agent was installed from, as heartbeats
report it with the agent's version (in-place upgrades keep the node)."""
from peewee import *


def up(migrator, db):
    migrator.migrate(migrator.add_column('node', 'bundle_sha256', CharField(max_length=64, default='')))


def down(migrator, db):
    migrator.migrate(migrator.drop_column('node', 'bundle_sha256'))
