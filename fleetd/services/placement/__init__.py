"""Placement: where work goes.

- ``terms``       a spec as the engine's request; a job's terms and group key
- ``cluster``     the inventory and rules the scheduler reads, and the capacity views
- ``engines``     placement engines kept between passes
- ``parking``     groups found not to fit, and the events that wake them
- ``scheduling``  a scheduling pass: read the queue, decide, write
- ``loop``        the scheduler loop that runs passes after kicks
- ``policy``      GPU type prices, team quotas, schedule simulation
"""
