"""fleetd: the control plane of a bare-metal GPU fleet.

Nothing is imported here: `fleetd serve` monkey-patches with gevent before Flask, the database
drivers or ssl are ever imported (the app is built by fleetd.app.create_app).
"""

__version__ = "0.1.0"
