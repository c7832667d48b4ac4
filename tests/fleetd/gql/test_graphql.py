"""GraphQL in process (the Flask test client, the agent side spoken by the test): the seed's
cluster operations and the pod names, field mapping, errors with extensions.code, api_key, roles,
depth and cost limits. tests/agent/test_graphql_e2e.py runs them against real processes."""

import pytest

from fleetd.server import scrub_secrets
from tests.fleetd.services.workloads.test_instances import start
from tests.support.gpus import GPU_H100

MODEL = GPU_H100["model"]
DEPLOY = """mutation deploy($model: String) { clusterFindAndDeployOnDemand(input: {
  cloudType: ALL, gpuCount: 1, volumeInGb: 40, containerDiskInGb: 40, minVcpuCount: 2,
  minMemoryInGb: 15, gpuTypeId: $model, name: "tf", imageName: "",
  dockerArgs: "python3 -m http.server 8888", ports: "8888/http", volumeMountPath: "/workspace",
  env: [{ key: "JUPYTER_PASSWORD", value: "pw" }],
  startSsh: true, supportPublicIp: true, dataCenterId: null }) {
    id imageName env machineId machine { clusterHostId podHostId } dockerArgs gpuCount memoryInGb
    volumeInGb podType desiredStatus state } }"""


def gql(api, query, variables=None, expect=200, token=..., params=""):
    resp = api.call(
        "POST",
        f"/graphql{params}",
        token=token,
        json={"query": query, "variables": variables or {}},
    )
    assert resp.status_code == expect, resp.get_json()
    return resp.get_json()


@pytest.fixture
def fleet(api):
    api.create_fleet("gpu-a")
    token = api.create_join_token("gpu-a")
    node, session = api.ready_node(token, "host-1", gpu_count=2)
    return node, session


def test_the_seed_create_maps_onto_an_instance_spec(api, fleet):
    node, _ = fleet
    made = gql(api, DEPLOY, {"model": MODEL})["data"]["clusterFindAndDeployOnDemand"]
    assert made["machineId"] == node and made["machine"]["clusterHostId"] == "host-1"
    assert (
        made["env"] == ["JUPYTER_PASSWORD=pw"]
        and made["dockerArgs"] == "python3 -m http.server 8888"
    )
    assert (made["gpuCount"], made["memoryInGb"], made["volumeInGb"]) == (1, 15, 40)
    assert (made["podType"], made["desiredStatus"], made["state"]) == (
        "RESERVED",
        "RUNNING",
        "starting",
    )
    spec = api.get(f"/api/v1/instances/{made['id']}").get_json()["spec"]
    assert spec["command"] == ["python3", "-m", "http.server", "8888"] and spec["image"] is None
    assert spec["resources"] == {
        "gpus": 1,
        "gpu_types": [MODEL],
        "cpus": 2.0,
        "memory_bytes": 15 << 30,
    }
    assert spec["volume_bytes"] == 40 << 30 and spec["ports"] == [
        {"port": 8888, "protocol": "http"}
    ]


def test_runtime_stop_resume_bid_resume_and_terminate_through_the_cluster_names(api, fleet):
    _, session = fleet
    made = gql(
        api,
        """mutation { clusterRentInterruptable(input: {bidPerGpu: 0.2, cloudType: SECURE,
        gpuCount: 1, name: "spot", dockerArgs: "sleep 1000", ports: "8888/http,22/tcp"}) {
        id podType bidPerGpu } }""",
    )
    pod = made["data"]["clusterRentInterruptable"]
    assert pod["podType"] == "INTERRUPTABLE" and pod["bidPerGpu"] == 0.2
    assignment = start(api, session, [(8888, 40001), (22, 40002)])
    listed = gql(
        api,
        """query clusters { myself { clusters { id name runtime { uptimeInSeconds
        ports { ip isIpPublic privatePort publicPort type }
        gpus { id gpuUtilPercent memoryUtilPercent }
        container { cpuPercent memoryPercent } } } } }""",
    )["data"]["myself"]["clusters"]
    assert [c["id"] for c in listed] == [pod["id"]]
    ports = listed[0]["runtime"]["ports"]
    assert [(p["privatePort"], p["publicPort"], p["type"]) for p in ports] == [
        (8888, 40001, "http"),
        (22, 40002, "tcp"),
    ]
    stopped = gql(
        api,
        f'mutation {{ clusterStop(input: {{clusterId: "{pod["id"]}"}}) {{ id desiredStatus }} }}',
    )
    assert stopped["data"]["clusterStop"]["desiredStatus"] == "EXITED"
    api.task_call(session, assignment, "finish", outcome="cancelled")
    one = gql(
        api,
        f'query {{ cluster(input: {{clusterId: "{pod["id"]}"}}) {{ state runtime {{ '
        f"uptimeInSeconds }} }} }}",
    )
    assert one["data"]["cluster"] == {"state": "stopped", "runtime": None}
    resumed = gql(
        api,
        f"""mutation {{ clusterBidResume(input: {{clusterId: "{pod["id"]}", bidPerGpu: 0.3,
        gpuCount: 1}}) {{ id desiredStatus bidPerGpu }} }}""",
    )["data"]["clusterBidResume"]
    assert resumed["desiredStatus"] == "RUNNING" and resumed["bidPerGpu"] == 0.3
    gone = gql(api, f'mutation {{ clusterTerminate(input: {{clusterId: "{pod["id"]}"}}) }}')
    assert gone == {"data": {"clusterTerminate": None}}
    # its node has not ended the new run yet: deleting until it says so (the e2e test sees it gone)
    assert gql(api, "{ myself { pods { id desiredStatus } } }")["data"]["myself"]["pods"] == [
        {"id": pod["id"], "desiredStatus": "TERMINATED"}
    ]


def test_gpu_types_carry_prices_per_gpu_count(api, fleet):
    model = MODEL
    api.call("PUT", f"/api/v1/gpu-types/{model}", json={"price_per_hour": 2.5, "spot_min_bid": 0.8})
    found = gql(
        api,
        f"""query GpuTypes {{ gpuTypes(input: {{id: "{model}"}}) {{ id displayName memoryInGb
        maxGpuCount secureCloud communityCloud securePrice secureSpotPrice communityPrice
        one: lowestPrice(input: {{gpuCount: 1}}) {{ minimumBidPrice uninterruptablePrice }}
        three: lowestPrice(input: {{gpuCount: 3}}) {{
        minimumBidPrice uninterruptablePrice available }} }} }}""",
    )
    (gpu,) = found["data"]["gpuTypes"]
    assert (
        (gpu["id"], gpu["displayName"]) == (model, "H100 80GB HBM3")
        and gpu["maxGpuCount"] == 2
        and gpu["secureCloud"]
    )
    assert (gpu["securePrice"], gpu["secureSpotPrice"], gpu["communityPrice"]) == (2.5, 0.8, None)
    assert gpu["one"] == {"minimumBidPrice": 0.8, "uninterruptablePrice": 2.5}
    assert gpu["three"] == {
        "minimumBidPrice": None,
        "uninterruptablePrice": None,
        "available": False,
    }
    assert gql(api, '{ gpuTypes(input: {id: "no such"}) { id } }')["data"]["gpuTypes"] == []


def test_a_duplicate_name_is_a_conflict_error_and_a_bad_input_an_invalid_request(api, fleet):
    gql(
        api,
        'mutation { podFindAndDeployOnDemand(input: {name: "a", dockerArgs: "sleep 1", gpuCount: '
        "0}) { id } }",
    )
    again = gql(
        api,
        'mutation { podFindAndDeployOnDemand(input: {name: "a", dockerArgs: "sleep 1", gpuCount: '
        "0}) "
        "{ id } }",
    )
    (error,) = again["errors"]
    assert again["data"] == {"podFindAndDeployOnDemand": None}
    assert error["extensions"]["code"] == "conflict" and "'a' is taken" in error["message"]
    bad = gql(api, 'mutation { podFindAndDeployOnDemand(input: {name: "b", gpuCount: 1}) { id } }')[
        "errors"
    ][0]
    assert (
        bad["extensions"]["code"] == "invalid_request"
        and "command" in bad["extensions"]["details"]["fields"]
    )
    missing = gql(api, 'query { pod(input: {podId: "nope"}) { id } }')["errors"][0]
    assert missing["extensions"]["code"] == "not_found" and missing["path"] == ["pod"]
    syntax = gql(api, "query { pod(", expect=400)["errors"][0]
    assert syntax["extensions"]["code"] == "invalid_request"
    unknown = gql(api, "query { nothing }", expect=400)["errors"][0]
    assert unknown["extensions"]["code"] == "invalid_request" and "nothing" in unknown["message"]


def test_api_key_in_the_query_string_or_bearer_and_the_same_roles_as_rest(api, fleet):
    key = api.create_token("submitter", "alice")
    mine = gql(
        api,
        'mutation { podFindAndDeployOnDemand(input: {name: "m", dockerArgs: "sleep 1"}) { id } }',
        token=None,
        params=f"?api_key={key}",
    )["data"]["podFindAndDeployOnDemand"]["id"]
    gql(
        api,
        'mutation { podFindAndDeployOnDemand(input: {name: "admins", dockerArgs: "sleep 1"}) { id '
        "} }",
    )
    assert [
        p["id"] for p in gql(api, "{ myself { pods { id } } }", token=key)["data"]["myself"]["pods"]
    ] == [mine]
    assert len(gql(api, "{ myself { pods { id } } }")["data"]["myself"]["pods"]) == 2  # admin: all
    refused = gql(api, "{ myself { id } }", token=None, params="?api_key=fla_nope", expect=401)
    assert refused["errors"][0]["extensions"]["code"] == "unauthorized" and "fla_nope" not in str(
        refused
    )
    assert (
        gql(api, "{ myself { id } }", token=None, expect=401)["errors"][0]["extensions"]["code"]
        == "unauthorized"
    )
    metrics = api.create_token("metrics", "scraper")
    assert (
        gql(api, "{ myself { id } }", token=metrics, expect=403)["errors"][0]["extensions"]["code"]
        == "forbidden"
    )
    assert api.get(f"/api/v1/whoami?api_key={key}", token=None).status_code == 401  # /graphql only


def test_get_runs_queries_only_and_a_mutation_by_get_is_405(api):
    got = api.get("/graphql?query={myself{id}}")
    assert got.status_code == 200 and got.get_json() == {"data": {"myself": {"id": "admin"}}}
    mutation = api.get('/graphql?query=mutation{podStop(input:{podId:"x"}){id}}')
    assert mutation.status_code == 405 and mutation.headers["Allow"] == "POST"
    error = mutation.get_json()["errors"][0]
    assert (
        error["extensions"]["code"] == "invalid_request"
        and "mutation runs by POST" in error["message"]
    )
    named = api.get(
        "/graphql?query=query q{myself{id}} mutation "
        'm{podStop(input:{podId:"x"}){id}}&operationName=q'
    )
    assert named.status_code == 200 and named.get_json()["data"] == {"myself": {"id": "admin"}}


def test_the_standard_introspection_query_of_graphql_tools_runs(api):
    from graphql import get_introspection_query

    schema = gql(api, get_introspection_query(descriptions=True))["data"]["__schema"]
    assert {"podFindAndDeployOnDemand", "clusterBidResume", "podTerminate"} <= {
        f["name"] for t in schema["types"] if t["name"] == "Mutation" for f in t["fields"]
    }


def doubling(n, leaf="__typename"):
    """The audit's 1 KB document: each fragment spreads the next twice, so the last runs 2^n
    times."""
    chain = " ".join(f"fragment F{i} on Query {{ ...F{i + 1} ...F{i + 1} }}" for i in range(n))
    return f"query {{ ...F0 }} {chain} fragment F{n} on Query {{ {leaf} }}"


def wide(fields, spreads):
    """One fragment of `fields` __typename aliases spread `spreads` times: cost fields x spreads."""
    aliases = " ".join(f"t{i}: __typename" for i in range(fields))
    return "query { " + " ".join(["...W"] * spreads) + f" }} fragment W on Query {{ {aliases} }}"


@pytest.mark.parametrize(
    "document, limit",
    [
        (doubling(26), "the cost limit"),  # 2^26 spreads: minutes of the event loop before
        (doubling(40, "myself { id }"), "the cost limit"),
        (wide(1000, 11), "the cost limit"),  # __typename costs 1 like any field
        (
            "{ " + " ".join(f"a{i}: myself {{ pods {{ id name }} }}" for i in range(2600)) + " }",
            "the size limit",
        ),
        ("{ " + "__typename " * 6000 + "}", "the size limit"),
        ("{ " + "a " * 6000 + "}", "the token limit"),
        ("{ " + "__typename @skip(if: false) " * 1000 + "}", "the token limit"),
        (" ".join(f"query q{i} {{ __typename }}" for i in range(101)), "the definition limit"),
        ("{ " + "a { " * 13 + "b" + " }" * 13 + " }", "the depth limit"),
        (
            "query { a { ...D } } fragment D on Query { " + "a { " * 12 + "b" + " }" * 12 + " }",
            "the depth limit",
        ),
        (
            "query { ...A } fragment A on Query { ...B } fragment B on Query { ...A }",
            "spreads itself",
        ),
    ],
    ids=[
        "doubling-26",
        "doubling-40",
        "typename-aliases",
        "aliased-fields",
        "typename",
        "tokens",
        "skips",
        "operations",
        "depth",
        "depth-fragment",
        "cycle",
    ],
)
def test_a_document_over_a_limit_is_refused_naming_it_before_anything_runs(api, document, limit):
    for call in (
        lambda: api.call("POST", "/graphql", json={"query": document}),
        lambda: api.get("/graphql", query_string={"query": document}),
    ):
        resp = call()
        assert resp.status_code == 400, resp.get_json()
        error = resp.get_json()["errors"][0]
        assert error["extensions"]["code"] == "invalid_request" and limit in error["message"], error


def test_a_document_at_the_limits_runs(api):
    assert gql(api, wide(1000, 10))["data"]["t999"] == "Query"  # cost 10,000 exactly
    assert gql(api, doubling(12))["data"] == {"__typename": "Query"}  # 4,096 spreads of one field
    many = " ".join(f"query q{i} {{ __typename }}" for i in range(100))
    assert api.call(
        "POST", "/graphql", json={"query": many, "operationName": "q99"}
    ).get_json() == {"data": {"__typename": "Query"}}
    deep = "query { ...D } fragment D on Query { " + "a { " * 11 + "b" + " }" * 11 + " }"
    error = gql(api, deep, expect=400)["errors"][
        0
    ]  # 12 levels pass the limit; GraphQL then names the field
    assert (
        "Cannot query field 'a'" in error["message"]
        and error["extensions"]["code"] == "invalid_request"
    )
    assert "Syntax Error" in gql(api, "{ myself {", expect=400)["errors"][0]["message"]


@pytest.mark.parametrize(
    "line",
    [
        '"POST /graphql?api_key=fla_x.SECRET HTTP/1.1" 200',
        '"GET /graphql?query=%7Bx%7D&api%5Fkey=fla_x.SECRET HTTP/1.1" 400',
        '"GET /graphql?%61pi_key=fla_x.SECRET&query=1 HTTP/1.1" 400',
    ],
)
def test_access_and_error_log_lines_hide_the_api_key_however_its_name_is_encoded(line):
    scrubbed = scrub_secrets(line)
    assert "SECRET" not in scrubbed and "[redacted]" in scrubbed and "/graphql?" in scrubbed


@pytest.mark.parametrize(
    "body",
    [
        [],
        {},
        {"query": 5},
        {"query": "{ myself { id } }", "variables": "x"},
        {"query": "query a { myself { id } } query b { myself { id } }"},
        {"query": "fragment f on User { ...f } { myself { ...f } }"},
    ],
)
def test_a_request_that_cannot_run_is_a_400_invalid_request_and_runs_nothing(api, body):
    resp = api.post("/graphql", body)
    assert resp.status_code == 400 and resp.get_json().get("data") is None, resp.get_json()
    assert resp.get_json()["errors"][0]["extensions"]["code"] == "invalid_request"


def test_an_id_no_database_can_hold_is_refused_before_any_lookup(api):
    escaped = gql(api, '{ pod(input: {podId: "a\\u0000b"}) { id } }')  # GraphQL's own escape: a NUL
    assert (
        escaped["data"] == {"pod": None}
        and escaped["errors"][0]["extensions"]["code"] == "invalid_request"
    )
    assert "NUL" in escaped["errors"][0]["message"]
    in_json = gql(
        api,
        "query one($id: String!) { pod(input: {podId: $id}) { id } }",
        {"id": "a\x00b"},
        expect=400,
    )
    assert in_json["errors"][0]["extensions"]["code"] == "invalid_request"


def test_an_empty_pod_id_is_not_found_and_an_endless_size_is_refused_naming_it(api):
    """Two inputs schemathesis's GraphQL run found answered `internal`
    (tests/integration/test_schemathesis.py)."""
    error = gql(api, '{ pod(input: {podId: ""}) { id } }')["errors"][0]
    assert error["extensions"]["code"] == "not_found"
    huge = (
        'mutation { podFindAndDeployOnDemand(input: { name: "x", gpuCount: 0, dockerArgs: "sleep '
        '1",'
        " minMemoryInGb: -1.7976931348623157e+308 }) { id } }"
    )
    error = gql(api, huge)["errors"][0]
    assert error["extensions"] == {
        "code": "invalid_request",
        "details": {"fields": {"minMemoryInGb": ["not a size"]}},
    }


@pytest.mark.parametrize(
    "document",
    [
        '{ a(s: "x\\"y # z", b: """blo"ck\\""" q""", c: -1.5e3, d: [1,2], e: $v) @skip(if: true) { '
        "...F } } "
        "fragment F on Q { x }",
        "# a comment { a b }\n{ a,b , c }",
        "query ($x: Int = 3) { a(x: $x) { ... on T { b } } }",
        '{ a(b: """x\n"y"\n""") }',
        "\ufeff{ myself { id } }",
    ],
)
def test_the_token_count_is_graphqls_own(document):
    from graphql import get_introspection_query
    from graphql.language import Lexer, Source, TokenKind

    from fleetd.gql.limits import count_tokens

    for text in (document, get_introspection_query(descriptions=True)):
        lexer, tokens = Lexer(Source(text)), 0
        while lexer.advance().kind != TokenKind.EOF:
            tokens += 1
        assert count_tokens(text, 10**6) == tokens


def test_unterminated_strings_are_counted_in_one_pass():
    """A quote followed by escaped quotes to the end made the expression scan the rest again from
    each quote (quadratic: 15 s for 60 KB); an unterminated string is now one token."""
    from fleetd.gql.limits import count_tokens

    assert count_tokens('"' + '\\"' * 30000) == 1 and count_tokens('"\\' * 30000) == 1
    assert count_tokens('"""' + "a" * 65000) == 1
