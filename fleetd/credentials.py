"""Credentials without the web: token formats, roles, making and hashing tokens.

Services that issue tokens (API tokens, join tokens, node sessions) use this module; checking a
presented token against a request is fleetd.auth's, which builds on it.
"""

import hashlib
import hmac
import re
import secrets

from fleetd.models import Role, new_id

API_PREFIX = "fla_"
JOIN_PREFIX = "flj_"
NODE_PREFIX = "fln_"

# Roles as views name them: the three API token roles, then node sessions and join tokens.
ADMIN = Role.ADMIN.value
SUBMITTER = Role.SUBMITTER.value
METRICS = Role.METRICS.value
NODE = "node"
JOIN = "join"
ANY_ROLE = (ADMIN, SUBMITTER, METRICS, NODE, JOIN)

TOKEN_RE = re.compile(r"^(fla_|flj_|fln_)([0-9a-f]{20})\.([A-Za-z0-9_-]{43})$")


def hash_token(token):
    """SHA-256 hex digest: the only form in which a token is stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def make_token(prefix):
    """A new (id, token) pair: <prefix><id>.<secret>, with 256 random bits of secret."""
    token_id = new_id()
    return token_id, f"{prefix}{token_id}.{secrets.token_urlsafe(32)}"


def matches(token, stored_hash):
    """Constant-time comparison of a presented token with a stored hash."""
    return stored_hash is not None and hmac.compare_digest(hash_token(token), stored_hash)
