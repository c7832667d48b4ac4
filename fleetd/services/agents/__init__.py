"""The agent protocol, fleetd's side.

- ``sessions``  register, heartbeat, deregister
- ``work``      acquire, start, rendezvous, logs, finish, leases
"""
