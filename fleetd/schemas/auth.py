"""Schemas of sign-in: identity providers, binding rules, device sign-in and sessions."""

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from fleetd.credentials import PROJECT_ROLES, USER_ROLES
from fleetd.names import PROJECT_KEY
from fleetd.schemas.common import FullRegexp, Text, Time
from fleetd.schemas.people import UserSchema

PROVIDER_NAME = FullRegexp(
    r"^[a-z][a-z0-9-]{0,63}$", error="a provider name: a-z, 0-9 and -, a letter first"
)
# An http(s) URL: an ASCII host name or IPv4 address (IDNs in their xn-- form), an optional port
# and path, no query, fragment or credentials.
_URL = FullRegexp(
    r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*)?$",
    error="an http(s) URL without credentials, query or fragment",
)
_CLAIM = FullRegexp(
    r"^[A-Za-z0-9_.:/-]{1,128}$", error="a claim name: letters, digits and _ . : / -"
)


class ClaimsMapSchema(Schema):
    login = fields.String(validate=_CLAIM, metadata={"description": "default preferred_username"})
    display_name = fields.String(validate=_CLAIM, metadata={"description": "default name"})
    email = fields.String(validate=_CLAIM, metadata={"description": "default email"})
    groups = fields.String(validate=_CLAIM, metadata={"description": "default groups"})
    uid = fields.String(
        validate=_CLAIM, allow_none=True, metadata={"description": "a numeric uid claim, if any"}
    )
    gid = fields.String(validate=_CLAIM, allow_none=True)
    groups_gids = fields.String(validate=_CLAIM, allow_none=True)


class ProviderPutSchema(Schema):
    kind = fields.String(required=True, validate=validate.OneOf(["oidc", "jwt"]))
    issuer = Text(required=True, max_length=500, validate=[_URL])
    client_id = Text(max_length=255, load_default=None, allow_none=True)
    client_secret = Text(
        max_length=500,
        load_only=True,
        allow_none=True,
        metadata={"description": "write-only; left out: the stored one stays"},
    )
    audience = Text(max_length=255, load_default=None, allow_none=True)
    jwks_url = Text(max_length=500, validate=[_URL], load_default=None, allow_none=True)
    scopes = fields.List(
        fields.String(validate=FullRegexp(r"^[\x21\x23-\x5b\x5d-\x7e]{1,64}$")),
        validate=validate.Length(max=32),
        load_default=None,
        allow_none=True,
    )
    claims = fields.Nested(ClaimsMapSchema, load_default=None, allow_none=True)


class ProviderSchema(Schema):
    name = fields.String()
    kind = fields.String()
    issuer = fields.String()
    client_id = fields.String(allow_none=True)
    has_client_secret = fields.Function(lambda p: bool(p.client_secret))
    audience = fields.String(allow_none=True)
    jwks_url = fields.String(allow_none=True)
    scopes = fields.List(fields.String(), allow_none=True)
    claims = fields.Dict(allow_none=True)
    created_at = Time()


class ProviderListSchema(Schema):
    items = fields.List(fields.Nested(ProviderSchema))


class BoundProjectSchema(Schema):
    project = fields.String(required=True, validate=FullRegexp(PROJECT_KEY))
    role = fields.String(required=True, validate=validate.OneOf(PROJECT_ROLES))


class BindingSchema(Schema):
    provider = fields.String(required=True, validate=PROVIDER_NAME)
    claim = fields.String(required=True, validate=_CLAIM)
    contains = Text(max_length=255, load_default=None, allow_none=True)
    equals = Text(max_length=255, load_default=None, allow_none=True)
    role = fields.String(required=True, validate=validate.OneOf(USER_ROLES))
    team = Text(max_length=200, load_default=None, allow_none=True)
    projects = fields.List(
        fields.Nested(BoundProjectSchema), validate=validate.Length(max=100), load_default=list
    )

    @validates_schema
    def _one_test(self, data, **kwargs):
        if (data.get("contains") is None) == (data.get("equals") is None):
            raise ValidationError("a rule has exactly one of contains and equals")


class DeviceStartSchema(Schema):
    provider = fields.String(required=True, validate=PROVIDER_NAME)


class DeviceStartedSchema(Schema):
    provider = fields.String()
    device_code = fields.String()
    user_code = fields.String()
    verification_uri = fields.String()
    verification_uri_complete = fields.String(allow_none=True)
    interval = fields.Integer()
    expires_in = fields.Integer(allow_none=True)


class DeviceTokenSchema(Schema):
    device_code = Text(required=True, min_length=1, max_length=2048)
    provider = fields.String(
        validate=PROVIDER_NAME,
        load_default=None,
        allow_none=True,
        metadata={"description": "the sign-in's provider (needed when several are configured)"},
    )


class LoginSchema(Schema):
    provider = fields.String(required=True, validate=PROVIDER_NAME)
    id_token = Text(
        required=True,
        min_length=1,
        max_length=16384,
        metadata={
            "description": "the provider's ID token for fleetd's client id (an access token does "
            "not say which client it was issued to, so none is taken)"
        },
    )


class RefreshSchema(Schema):
    refresh_token = Text(required=True, min_length=1, max_length=512)


class SessionSchema(Schema):
    token = fields.String(
        metadata={"description": "the session's bearer token (fls_...), shown once"}
    )
    expires_at = Time()
    refresh_token = fields.String(
        metadata={"description": "gets the next session token; shown once"}
    )
    user = fields.Nested(UserSchema)
