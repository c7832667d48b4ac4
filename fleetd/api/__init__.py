"""REST API blueprints: MethodViews only; the work happens in fleetd.services."""

from fleetd.api import admin, agent, fleets, health, jobs, nodes, tokens

BLUEPRINTS = [health.blp, tokens.blp, fleets.blp, nodes.blp, jobs.blp, agent.blp, admin.blp]
