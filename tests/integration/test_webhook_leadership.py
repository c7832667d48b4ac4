"""Webhooks go out from the leader only: a replica whose lease another replica took on the real
PostgreSQL database sends nothing, even while its own (stopped) clock says it still leads."""

import pytest

from fleetd.db import bind, open_database, upgrade, write_transaction
from fleetd.replicas import Fenced, Leadership
from fleetd.runtime import Runtime
from fleetd.services.notify.webhooks import create_webhook, enqueue, list_deliveries, send_due
from fleetd.settings import Settings
from tests.integration.test_replicas import replica_db  # noqa: F401 - fixture
from tests.support import wait_until
from tests.support.webhooks import SECRET, receiver  # noqa: F401 - fixture

pytestmark = pytest.mark.integration


def test_a_deposed_leader_sends_no_webhook_and_records_nothing(replica_db, receiver, tmp_path):  # noqa: F811
    db = bind(open_database(replica_db))
    upgrade(db)
    try:
        rt = Runtime.build(
            Settings.load(
                environ={},
                db_url=replica_db,
                data_dir=str(tmp_path),
                webhooks_allow_targets="127.0.0.0/8",
            )
        )
        old = Leadership(
            lease_seconds=1, shared=True, monotonic=lambda: 0.0
        )  # a paused clock: never lapses
        assert old.tick()
        rt.leader = old
        hook = create_webhook(rt, None, receiver.url, SECRET, ["node.drained"])
        with write_transaction():
            enqueue(rt.clock.now(), "node.drained", "node/n1", {"reason": "rma"})

        new = Leadership(lease_seconds=1, shared=True)
        wait_until(new.tick, 10, message="the lease to lapse and the new replica to take it")
        assert old.leading()  # it still believes it leads
        with pytest.raises(Fenced, match="fenced off"):
            send_due(rt)
        assert receiver.requests == []
        [pending] = list_deliveries(hook.id, 10)[0]
        assert (pending.state, pending.attempts) == ("pending", 0)

        rt.leader = new
        assert send_due(rt)["delivered"] == 1
        assert len(receiver.requests) == 1 and receiver.requests[0][1]["webhook-id"] == pending.id
    finally:
        db.close()
