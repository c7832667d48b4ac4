"""REST API blueprints: MethodViews only; the work happens in fleetd.services."""

from fleetd.api import admin, agent, fleets, health, nodes, tokens

BLUEPRINTS = [health.blp, tokens.blp, fleets.blp, nodes.blp, agent.blp, admin.blp]
