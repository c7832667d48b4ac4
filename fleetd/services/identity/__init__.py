"""Who acts, and as whom.

- ``tokens``      API tokens; the first admin token
- ``identities``  who a task runs as on its node
- ``limits``      per-owner limits
"""
