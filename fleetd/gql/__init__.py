"""GraphQL over fleetd's services: the GPU-cloud cluster API's operations (`cluster...` names) and
the same operations under the `pod...` names that GPU-cloud SDKs send (docs/api.md, GraphQL).

`schema.py` holds the schema (SDL) and binds the resolvers of `resolvers.py`, which map GraphQL
inputs onto the REST schemas and services and the services' answers onto GraphQL's field names;
`limits.py` bounds a document's depth and cost before it runs.
"""
