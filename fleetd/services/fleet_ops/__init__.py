"""Running the fleet and fleetd itself.

- ``fleets``       fleets and their join tokens
- ``rollouts``     agent upgrades across a fleet
- ``replication``  what replicas on one PostgreSQL database share
- ``metrics``      Prometheus metrics, the 24 h history, storage measurement
- ``retention``    what fleetd forgets, and when
- ``config``       the effective configuration
"""
