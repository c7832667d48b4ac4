"""The agent protocol, fleetd's side.

- ``sessions``  register, heartbeat, deregister
- ``admission`` how many registrations this process takes on at once
- ``work``      acquire, start, logs, finish
- ``rendezvous`` where a gang's ranks find rank 0
- ``leases``    task leases renewed by heartbeats; tasks whose lease ran out
"""
