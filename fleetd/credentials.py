"""Credentials without the web: token formats, roles, making and hashing tokens.

Services that issue tokens (API tokens, join tokens, node sessions) use this module; checking a
presented token against a request is fleetd.auth's, which builds on it.
"""

import hashlib
import hmac
import re
import secrets

from fleetd.models import Role, new_id
from fleetd.names import name_problem

API_PREFIX = "fla_"
JOIN_PREFIX = "flj_"
NODE_PREFIX = "fln_"
SESSION_PREFIX = "fls_"

# Roles as views name them: the roles of users and API tokens, then node sessions and join tokens.
ADMIN = Role.ADMIN.value
OPERATOR = Role.OPERATOR.value
MEMBER = Role.MEMBER.value
SUBMITTER = Role.SUBMITTER.value
VIEWER = Role.VIEWER.value
METRICS = Role.METRICS.value
SCIM = Role.SCIM.value
NODE = "node"
JOIN = "join"
ANY_ROLE = (ADMIN, OPERATOR, MEMBER, SUBMITTER, VIEWER, METRICS, SCIM, NODE, JOIN)
USER_ROLES = (ADMIN, OPERATOR, MEMBER, VIEWER)  # what a user (or a binding rule) may be given
PROJECT_ROLES = ("admin", "member", "viewer")
READ_ALL = (ADMIN, OPERATOR, VIEWER)  # roles that read every job and instance
# Where work of a token without a user or project goes (migration 0031 makes it).
DEFAULT_PROJECT = "default"

TOKEN_RE = re.compile(r"^(fla_|flj_|fln_|fls_)([0-9a-f]{20})\.([A-Za-z0-9_-]{43})$")


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


TOKEN_NAME_MAX = 200
# What a token name may not hold: control characters (C0, DEL, C1: line breaks among them), the line
# and paragraph separators, invisible format characters (zero-width, direction marks and overrides,
# the byte order mark, the soft hyphen) and every space but the ASCII one.
_NOT_IN_NAMES = (
    r"\u0000-\u001f\u007f-\u00a0\u00ad\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u206f"
    r"\u3000\ufeff"
)
# A name is printable text on one line, with no space at either end. The API's OpenAPI document
# states this pattern (anchored, as JSON Schema patterns are read in full here).
TOKEN_NAME_PATTERN = rf"^[^ {_NOT_IN_NAMES}](?:[^{_NOT_IN_NAMES}]*[^ {_NOT_IN_NAMES}])?$"
_TOKEN_NAME = re.compile(TOKEN_NAME_PATTERN.removeprefix("^").removesuffix("$"))


def token_name_problem(name):
    """Why `name` cannot name an API token, or None. It appears in audit records as `token:<name>`,
    where a line break, a control or invisible character, or a look-alike space could pass one
    token off as another, or forge a second record."""
    if not 1 <= len(name) <= TOKEN_NAME_MAX:
        return f"a token name has 1 to {TOKEN_NAME_MAX} characters"
    if not _TOKEN_NAME.fullmatch(name):
        return (
            "a token name is printable text on one line (no line breaks, control or invisible "
            "characters, no space but the ASCII one) that neither starts nor ends with a space"
        )
    return name_problem(
        name
    )  # and no look-alike of another name (mixed scripts, compatibility forms)
