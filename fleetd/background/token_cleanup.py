"""Delete tokens that expired or were revoked longer ago than the retention period."""

from fleetd.services.identity.tokens import delete_expired_tokens

NAME = "token_cleanup"
DESCRIPTION = (
    "Deletes API and join tokens expired or revoked longer ago than token_retention_seconds"
)


def run(rt):
    """One cleanup; returns the counts deleted."""
    return delete_expired_tokens(rt.clock.now(), rt.settings.token_retention_seconds)
