"""Provisioning: offline bundles, templates for hosts, and `fleetd bootstrap` over SSH."""
