"""GraphQL by the pod names (in process): the spot create and bid-resume, runtime arguments through
the REST InstanceSpec's allow-list, and the connection wait that goes on past one long-poll
slice."""

import logging
import threading

from tests.fleetd.gql.test_graphql import fleet, gql  # noqa: F401 - the fixture
from tests.fleetd.services.workloads.test_instances import start
from tests.support import wait_until
from tests.support.http import ApiClient

SLICE_LOG = "fleetd.services.workloads.instances"


def test_a_spot_pod_is_rented_stopped_and_bid_resumed_by_the_pod_names(api, fleet):  # noqa: F811
    node_id, session = fleet
    made = gql(
        api,
        """mutation { podRentInterruptable(input: {bidPerGpu: 0.2, gpuCount: 1, name: "spot",
        dockerArgs: "sleep 1000", cloudType: ALL}) { id podType bidPerGpu desiredStatus } }""",
    )
    pod = made["data"]["podRentInterruptable"]
    assert (pod["podType"], pod["bidPerGpu"], pod["desiredStatus"]) == (
        "INTERRUPTABLE",
        0.2,
        "RUNNING",
    )
    assignment = start(api, session)
    assert gql(api, f'{{ pod(input: {{podId: "{pod["id"]}"}}) {{ costPerHr }} }}')["data"][
        "pod"
    ] == {"costPerHr": 0.2}
    gql(api, f'mutation {{ podStop(input: {{podId: "{pod["id"]}"}}) {{ id }} }}')
    api.task_call(session, assignment, "finish", outcome="cancelled")
    assert (
        api.post(f"/api/v1/nodes/{node_id}/cordon").status_code == 200
    )  # the resumed run waits, unplaced
    resumed = gql(
        api,
        f"""mutation {{ podBidResume(input: {{podId: "{pod["id"]}", bidPerGpu: 0.35, gpuCount: 1}})
        {{ id desiredStatus bidPerGpu podType costPerHr }} }}""",
    )["data"]["podBidResume"]
    assert resumed == {
        "id": pod["id"],
        "desiredStatus": "RUNNING",
        "bidPerGpu": 0.35,
        "podType": "INTERRUPTABLE",
        "costPerHr": 0.35,
    }  # the new bid's price, not the last run's
    shown = api.get(f"/api/v1/instances/{pod['id']}").get_json()
    assert (shown["state"], shown["spec"]["bid"], shown["price_per_hour"]) == (
        "pending",
        0.35,
        0.35,
    )
    assert api.post(f"/api/v1/nodes/{node_id}/uncordon").status_code == 200
    start(api, session)  # placed: the same price
    assert api.get(f"/api/v1/instances/{pod['id']}").get_json()["price_per_hour"] == 0.35
    again = gql(
        api,
        f'mutation {{ podBidResume(input: {{podId: "{pod["id"]}", bidPerGpu: 0.5}}) {{ id }} }}',
    )
    assert (
        again["data"]["podBidResume"] is None
        and again["errors"][0]["extensions"]["code"] == "conflict"
    )


CREATE_WITH_ARGS = """mutation deploy($args: [String!], $image: String) {
  podFindAndDeployOnDemand(input: {
  name: "c", imageName: $image, dockerArgs: "sleep 1d", gpuCount: 0, runtimeArgs: $args}) {
  id runtimeArgs } }"""


def test_runtime_args_pass_the_rest_allow_list_and_read_back_on_the_pod(api):
    made = gql(
        api, CREATE_WITH_ARGS, {"args": ["--shm-size=8g", "--init"], "image": "localhost/app:1"}
    )
    pod = made["data"]["podFindAndDeployOnDemand"]
    assert pod["runtimeArgs"] == ["--shm-size=8g", "--init"]
    assert api.get(f"/api/v1/instances/{pod['id']}").get_json()["spec"]["runtime_args"] == [
        "--shm-size=8g",
        "--init",
    ]
    read = gql(api, f'{{ pod(input: {{podId: "{pod["id"]}"}}) {{ runtimeArgs }} }}')["data"]["pod"]
    assert read == {"runtimeArgs": ["--shm-size=8g", "--init"]}
    for args, image in (
        (["--privileged"], "localhost/app:1"),
        (["--volume=/:/host"], "localhost/app:1"),
        (["--init"], None),
    ):  # the last: a host process takes no runtime arguments
        bad = gql(api, CREATE_WITH_ARGS, {"args": args, "image": image})
        assert bad["data"]["podFindAndDeployOnDemand"] is None
        error = bad["errors"][0]["extensions"]
        assert (
            error["code"] == "invalid_request" and "runtime_args" in error["details"]["fields"]
        ), bad
    assert [i["id"] for i in api.get("/api/v1/instances").get_json()["items"]] == [
        pod["id"]
    ]  # nothing else stored


CONNECTION = """query conn($id: String!, $wait: Int) { podConnection(input: {podId: $id, port: 8888,
  waitSeconds: $wait}) { url host port protocol } }"""


def test_the_connection_wait_goes_on_past_a_slice_and_answers_once_the_pod_runs(api, fleet, caplog):  # noqa: F811
    _, session = fleet
    caplog.set_level(logging.DEBUG, logger=SLICE_LOG)
    made = gql(
        api,
        'mutation { podFindAndDeployOnDemand(input: {name: "nb", dockerArgs: "sleep 1d", '
        'ports: "8888/http"}) { id } }',
    )["data"]["podFindAndDeployOnDemand"]
    answers = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            gql(ApiClient(api.app, api.token), CONNECTION, {"id": made["id"], "wait": 60})
        )
    )
    waiter.start()
    # The first slice (the tests' long_poll_max_seconds, 0.5 s) ended without an answer; the wait
    # goes on.
    wait_until(
        lambda: any(
            "after wait slice 1;" in r.getMessage() for r in caplog.records if r.name == SLICE_LOG
        ),
        timeout=30,
        message="the first slice of the connection wait to end",
    )
    start(api, session, [(8888, 40001)])
    waiter.join(timeout=30)
    assert answers == [
        {
            "data": {
                "podConnection": {
                    "url": "http://10.0.0.1:40001/",
                    "host": "10.0.0.1",
                    "port": 40001,
                    "protocol": "http",
                }
            }
        }
    ]
    cluster = gql(api, f'{{ clusterConnection(input: {{clusterId: "{made["id"]}"}}) {{ url }} }}')
    assert cluster == {"data": {"clusterConnection": {"url": "http://10.0.0.1:40001/"}}}


def test_a_connection_wait_that_ends_is_a_timeout_and_bad_waits_are_refused(api, fleet):  # noqa: F811
    made = gql(
        api,
        'mutation { podFindAndDeployOnDemand(input: {name: "nb", dockerArgs: "sleep 1d", '
        'ports: "8888/http", gpuCount: 4}) { id } }',
    )["data"]["podFindAndDeployOnDemand"]  # never placed
    timed_out = gql(api, CONNECTION, {"id": made["id"], "wait": 1})
    assert timed_out["data"]["podConnection"] is None
    assert timed_out["errors"][0]["extensions"] == {
        "code": "timeout",
        "details": {"state": "pending"},
    }
    for wait in (-1, 301):
        bad = gql(api, CONNECTION, {"id": made["id"], "wait": wait})
        assert bad["data"]["podConnection"] is None
        assert bad["errors"][0]["extensions"] == {
            "code": "invalid_request",
            "details": {"fields": {"waitSeconds": ["0 to 300"]}},
        }
    for wait in ("5", 2.5, 2**31):  # not an Int: the document does not run
        bad = gql(api, CONNECTION, {"id": made["id"], "wait": wait}, expect=400)
        assert bad["data"] is None and bad["errors"][0]["extensions"] == {
            "code": "invalid_request"
        }, bad
    inline = gql(
        api,
        f'{{ podConnection(input: {{podId: "{made["id"]}", waitSeconds: 1.5}}) {{ url }} }}',
        expect=400,
    )
    assert inline["errors"][0]["extensions"] == {"code": "invalid_request"}
    port = gql(api, f'{{ podConnection(input: {{podId: "{made["id"]}", port: 0}}) {{ url }} }}')
    assert port["errors"][0]["extensions"]["code"] == "invalid_request"
    gone = gql(api, '{ podConnection(input: {podId: "nope"}) { url } }')
    assert gone["errors"][0]["extensions"]["code"] == "not_found"
