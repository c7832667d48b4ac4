"""The agent protocol's shared terms: what fleetd and fleet-agent must agree on, defined once.

Both programs import this package and nothing of each other (the agent never imports the
server), so it holds plain Python only: no Flask, no marshmallow, no peewee.
"""

MAX_ASSIGNMENTS = 64  # the most assignments one acquire delivers
MAX_FINISHES = 64  # the most finish reports one call carries
