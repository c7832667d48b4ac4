"""Schema of the effective configuration."""

from marshmallow import Schema, fields


class EffectiveConfigSchema(Schema):
    settings = fields.Dict(
        keys=fields.String(),
        metadata={
            "description": "every setting (FLEETD_<NAME> in upper case) as this process uses it"
        },
    )
    derived = fields.Dict(
        keys=fields.String(),
        metadata={
            "description": (
                "values computed from them: database_url, failover_grace_seconds, policy_by_fleet"
            )
        },
    )
    config_file = fields.String(
        allow_none=True, metadata={"description": "the TOML file read (FLEETD_CONFIG), or null"}
    )
    redacted = fields.List(
        fields.String(),
        metadata={
            "description": (
                "settings whose secret part reads (redacted): a URL's password, a secret's value"
            )
        },
    )
