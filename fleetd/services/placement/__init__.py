"""Placement: where work goes.

- ``terms``       a spec as the engine's request; a job's terms and group key
- ``cluster``     the inventory and rules the scheduler reads, and the capacity views
- ``engines``     placement engines kept between passes
- ``parking``     groups found not to fit, and the events that wake them
- ``scheduling``  the scheduler loop and its passes
- ``policy``      GPU type prices, team quotas, schedule simulation
"""
