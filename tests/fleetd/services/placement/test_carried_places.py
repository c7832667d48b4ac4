"""An inventory patched in one worker thread while another fills the caches of the inventory it
is patched from (a pass's engine build makes every node's place as it goes): the patch copies
each cache before it iterates it, so it never fails on a cache that grew meanwhile."""

import sys
import threading
import types

from fleetd.services.placement.network import carried_places


def test_places_added_by_another_thread_meanwhile_do_not_fail_the_patch():
    fleet = types.SimpleNamespace(network_topology=None)
    nodes = {f"n{i:06d}": types.SimpleNamespace(fleet_id="sim") for i in range(20_000)}
    previous = types.SimpleNamespace(
        fleets={"sim": fleet}, network_files={}, places={f"n{i:06d}": None for i in range(5_000)}
    )
    done = threading.Event()

    def fill():  # what node_place does for every node of an engine being built
        for i in range(400_000):
            previous.places[f"m{i:07d}"] = None
            if done.is_set():
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns as often as they can
    filler = threading.Thread(target=fill)
    try:
        filler.start()
        for _ in range(10):
            _, places = carried_places(previous, {"sim": fleet}, nodes, frozenset())
            assert set(places) <= set(nodes)
    finally:
        done.set()
        filler.join(10)
        sys.setswitchinterval(interval)
