"""fleet-agent: the host agent of fleetd."""
