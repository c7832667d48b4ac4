"""The executable schema: schema.graphql with the resolvers bound."""

from importlib import resources

from ariadne import make_executable_schema

from fleetd.gql.resolvers import BINDABLES

SDL = resources.files("fleetd.gql").joinpath("schema.graphql").read_text(encoding="utf-8")
SCHEMA = make_executable_schema(SDL, *BINDABLES)
