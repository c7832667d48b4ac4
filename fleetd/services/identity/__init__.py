"""Who acts, and as whom.

- ``tokens``      API tokens; the first admin token
- ``identities``  who a task runs as on its node
- ``limits``      per-owner limits
- ``users``       people: read, change, deactivate
- ``projects``    projects, their members and service accounts; where work goes
- ``access``      who may read and change which work
- ``oidc``        identity providers: discovery, keys, ID tokens, the device grant
- ``signin``      binding rules, users from claims, sessions and their refresh
- ``browser``     the admin UI's sign-in: authorization code with PKCE
- ``scim_read``   SCIM: what fleetd supports, parsing, users and groups as resources
- ``scim``        SCIM: writing users and groups, deactivation, groups into the rules
"""
