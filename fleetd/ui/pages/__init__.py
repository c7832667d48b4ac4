"""The UI's pages, one module per area; each adds its routes to fleetd.ui.blueprint.bp."""
