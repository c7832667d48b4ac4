"""REST API blueprints: MethodViews only; the work happens in fleetd.services."""

from fleetd.api import (
    admin,
    agent,
    cluster,
    fleets,
    health,
    instances,
    jobs,
    metrics,
    nodes,
    rollouts,
    tokens,
    webhooks,
)

BLUEPRINTS = [
    health.blp,
    tokens.blp,
    fleets.blp,
    nodes.blp,
    jobs.blp,
    instances.blp,
    cluster.blp,
    agent.blp,
    admin.blp,
    metrics.blp,
    webhooks.blp,
    rollouts.blp,
]

from fleetd.api import gpus, validation  # noqa: E402 - the validation gate and GPU history (issue 35)

BLUEPRINTS += [validation.blp, gpus.blp]

from fleetd.api import config  # noqa: E402 - the effective configuration (issue 33)

BLUEPRINTS += [config.blp]

from fleetd.api import usage  # noqa: E402 - usage, chargeback and budgets (issue 34)

BLUEPRINTS += [usage.blp]

from fleetd.api import host_ports  # noqa: E402 - seed 000's assign-host-port (issue 44)

BLUEPRINTS += [host_ports.blp]

from fleetd.api import auth, people  # noqa: E402 - people, projects and sign-in (issue 45)

BLUEPRINTS += [people.blp, auth.blp]

from fleetd.api import notifications, shares  # noqa: E402 - share links and notification feeds

BLUEPRINTS += [shares.blp, notifications.blp]
