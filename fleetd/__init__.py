"""fleetd: the control plane of a bare-metal GPU fleet."""

__version__ = "0.1.0"


def create_app(settings=None, **kwargs):
    """Build the Flask application (see fleetd.app.create_app)."""
    # Imported here so that `fleetd serve` can monkey-patch with gevent before
    # Flask, the database drivers or ssl are ever imported.
    from fleetd.app import create_app as _create_app

    return _create_app(settings, **kwargs)
