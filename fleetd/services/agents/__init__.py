"""The agent protocol, fleetd's side.

- ``sessions``  register, heartbeat, deregister
- ``work``      acquire, start, logs, finish
- ``rendezvous`` where a gang's ranks find rank 0
- ``leases``    task leases renewed by heartbeats; tasks whose lease ran out
"""
