"""Nodes and their GPUs.

- ``nodes``         admin actions (cordon, drain, revoke, delete), drains, liveness, inventory
- ``inventory``     a node's GPUs as its agent reports them
- ``hosts``         a host's identity that outlives its node
- ``labels``        a node's labels from the agent and from the API
- ``gpus``          GPU boards by serial number, the RMA mark
- ``gpu_history``   where each board has been
- ``health_policy`` the node health policy
- ``holds``         GPU holds that outlived their task
- ``validation``    the validation gate
- ``upgrades``      a node's agent upgrade
- ``accounts``      owners' own accounts on the nodes of nss fleets
"""
