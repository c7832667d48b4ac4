"""A host's identity outlives its node: the node of a deleted host is remembered by the host's
machine id, so that the same host enrolling again (a Terraform `-replace`, a `bootstrap --remove`
then a bootstrap) gets its old node id back and its history goes on instead of splitting."""

from fleetd.models import Node, RetiredNode


def retire(node, now):
    """Remember the node of a host about to be deleted (inside the delete's transaction)."""
    # An upsert that SQLite and PostgreSQL both take (PostgreSQL has no INSERT OR REPLACE).
    RetiredNode.insert(
        machine_id=node.machine_id, node_id=node.id, fleet=node.fleet_id, retired_at=now
    ).on_conflict(
        conflict_target=[RetiredNode.machine_id],
        update={
            RetiredNode.node_id: node.id,
            RetiredNode.fleet: node.fleet_id,
            RetiredNode.retired_at: now,
        },
    ).execute()


def returning_node(machine_id):
    """(node id, retired row) a host of this machine id had before its node was deleted, or (None,
    None) (also when that id is in use again). Call inside the registering transaction."""
    row = RetiredNode.get_or_none_by_id(machine_id)
    if row is None or Node.get_or_none_by_id(row.node_id) is not None:
        return None, None
    return row.node_id, row


def forget(row):
    """The host is back under its old id: the row has done its job."""
    if row is not None:
        RetiredNode.delete().where(RetiredNode.machine_id == row.machine_id).execute()
