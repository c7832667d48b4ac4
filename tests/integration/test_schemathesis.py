"""Schemathesis against a live `fleetd serve`: every check, stateful phase on, bounded examples.

The audit's guard: 0 server errors and 0 spec violations on the API routes and on the agent
routes, with any allowed exception listed in ALLOWED below with its reason.

The `schemathesis run` command line runs as a subprocess (one per route group, each against a
fresh server) with `--checks all` and the examples, coverage, fuzzing and stateful phases; its
NDJSON event log is read back and every failing check is listed, deduplicated, in the assertion
message. A run is deterministic for a given seed (FLEETD_SCHEMATHESIS_SEED); the example count
per operation is FLEETD_SCHEMATHESIS_EXAMPLES.

Run: .venv/bin/pytest -m integration tests/integration/test_schemathesis.py -v
"""

import base64
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jsonschema_rs  # schemathesis's own validator, installed with it
import pytest

from tests.support import wait_until
from tests.support.gpus import gpus
from tests.support.http import Http
from tests.support.server import FleetdProcess, fleetd_init

pytestmark = pytest.mark.integration

SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))
MAX_EXAMPLES = int(
    os.environ.get("FLEETD_SCHEMATHESIS_EXAMPLES", "50")
)  # more for a deeper run: the env var
SEED = int(os.environ.get("FLEETD_SCHEMATHESIS_SEED", "20260101"))
# Seconds per `schemathesis run`: about 2 minutes alone here, with room for a loaded machine.
RUN_TIMEOUT = 420
PHASES = "examples,coverage,fuzzing,stateful"

# (check, operation regex, regex over the response body, why). Keep this short and honest: an
# entry belongs here only when the check cannot hold by design, never because a fix is pending.
ALLOWED = [
    (
        "use_after_free",
        r"(GET|PATCH|DELETE) /api/v1/users/\{login\}",
        r'"active": ?false|^$',
        "DELETE of a user deactivates it and keeps it (docs/api.md, Users): the work and usage it "
        "owned keep its name, so it still reads 200 with active false (a DELETE again: 204)",
    ),
    (
        "positive_data_acceptance",
        r"GET /api/v1/.*",
        r'"message":"invalid cursor"',
        "a cursor is opaque: only one the server issued is valid, and no schema can describe that "
        "set; any other string is refused 400 invalid_request (tests/fleetd/api/test_bad_input.py)",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/agent/(register|heartbeat)",
        r"GPU uuids must be unique",
        "uniqueness of one key across array items is not expressible in OpenAPI 3.0 (uniqueItems "
        "compares whole items)",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/agent/finish",
        r"each task may be reported once per call",
        "the same: uniqueness of task_id across the finishes array is not expressible in OpenAPI "
        "3.0",
    ),
    (
        "positive_data_acceptance",
        r".*",
        r"invalid label key|an environment variable name|a login",
        "the keys of a map (labels, env) follow a pattern; OpenAPI 3.0 cannot constrain keys "
        "(propertyNames came with 3.1), and a wrong key is refused 400 naming it",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/(jobs|cluster/simulate-schedule|agent/.*finish)",
        r"a bid applies to spot jobs only|a fraction of a GPU cannot be exclusive|only a finish "
        r"that carries the start|apply to one shared GPU",
        "rules across two fields (bid needs spot; a fraction is never exclusive; a GPU memory or "
        "compute share needs a fraction of one GPU; started_seconds_ago needs pid): OpenAPI 3.0 "
        "describes fields one by one",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/(jobs|cluster/simulate-schedule)",
        r"unknown artifact",
        "a job may name only artifacts its token uploaded: which exist is the server's state, not "
        "the document's (the refusal names them; "
        "tests/fleetd/services/workloads/test_artifacts.py)",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/agent/tasks/\{task_id\}/logs",
        r"stream must be stdout|text must be a string|rank must be an integer|\[stream, text\] or "
        r"\[stream, text, rank\]|lines must be",
        "a line is a tuple ([line, at_ms, stream, text], or from an older agent [stream, text, "
        "rank?]); OpenAPI 3.0 has no tuples (prefixItems came with 3.1), so the document allows "
        "strings or integers in any position; and a batch's lines must lie within its first_line "
        "and count, a rule across fields",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/agent/tasks/\{task_id\}/logs",
        r"last_at must not be before first_at|(count|first_at|last_at|bytes) must be an integer "
        r"from",
        "a batch's times are a range, and a numbered batch (one with first_line) brings count, "
        "first_at, last_at and bytes with it, while an older agent's batch has none of them: rules "
        "across fields, which OpenAPI 3.0 describes one by one",
    ),
    (
        "positive_data_acceptance",
        r"PUT /api/v1/agent/tasks/\{task_id\}/output/\{first_line\}",
        r"the chunk is not one|the chunk holds|first_line must be a line number",
        "a chunk is gzip of frames that must hold the lines and bytes its query says: what bytes "
        "are inside a body is more than a document can state; the path's first_line is a number "
        "in a string segment",
    ),
    (
        "positive_data_acceptance",
        r"GET /api/v1/(jobs/\{job_id\}|instances/\{instance_id\})/logs",
        r"an RFC 3339 time|is not a regex fleetd takes",
        "since and until are RFC 3339 times, which the document gives as a date-time format that "
        "the generator's strings do not always keep (a February 30); q with q_regex must be a "
        "regex in RE2's syntax, a grammar no schema states",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/(instances|cluster/simulate-schedule|agent/.*finish"
        r"|agent/tasks/\{task_id\}/start)",
        r"each port at most once|each declared port at most once",
        "uniqueness of one key (port) across array items is not expressible in OpenAPI 3.0",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/(instances(/\{instance_id\}/resume)?|cluster/simulate-schedule)",
        r"a bid applies to spot instances only|a command is required without an image|idle stop "
        r"watches GPU|FLEET_\* variables are set|runtime arguments apply to an image",
        "rules across two fields (bid needs spot; no image needs a command; an idle rule needs "
        "GPUs; runtime arguments need an image; on resume, a bid needs the instance to be spot, "
        "which is the server's state) and reserved env names (FLEET_*, set by the agent; OpenAPI "
        "3.0 cannot constrain keys): the document describes fields one by one (simulate-schedule "
        "takes an InstanceSpec too)",
    ),
    (
        "positive_data_acceptance",
        r"(POST|PATCH) /api/v1/fleets(/\{name\})?",
        r"mig\.layout|mig\.settle_seconds|topology file",
        "a MIG layout names GPU models fleetd has profile tables for, and profiles of that model "
        "that fit on one GPU together, with mode fixed; settle_seconds goes with mode dynamic: "
        "NVIDIA's tables and rules across fields, not a document's "
        "(tests/fleetd/services/placement/test_fleet_mig.py); a network topology "
        "file follows Slurm's topology.conf grammar, which no schema states (a wrong line is a 400 "
        "naming it: tests/fleetd/scheduler/test_network_file.py)",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/agent/(register|heartbeat)",
        r"topology|mig_devices",
        "a GPU topology is square and symmetric over the GPUs the same body reports, self on its "
        "diagonal only, NVLinks counted exactly where a pair's class has them, and comes with "
        "those gpus; a GPU's MIG devices have distinct uuids and share no memory slot, start with "
        "size: rules across fields and items that OpenAPI 3.0 cannot state "
        "(tests/fleetwire/test_topology.py, tests/fleetwire/test_mig.py)",
    ),
    (
        "positive_data_acceptance",
        r"GET /api/v1/instances/\{instance_id\}/connection",
        r"declares several ports",
        "`port` may be left out only when the instance declares one port: which ports it declares "
        "is the server's state, not the document's",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/webhooks",
        r"not a URL|must be an http|must name a host|must not carry credentials|must not have a "
        r"fragment",
        "a webhook's URL must be an absolute http(s) URL naming a host, without credentials or a "
        "fragment, with a valid port; the document states the scheme as a pattern but cannot state "
        "the rest of a URL's grammar",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/cluster/simulate-schedule",
        r'"command":\["(Missing data for required field|Length must be between)',
        "simulate-schedule reads a body as an InstanceSpec when it says kind: instance or holds a "
        "field only instances have, else as a JobSpec (which needs a command); the document's "
        "anyOf of the two specs cannot say which of them applies to a body that fits both",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/(instances|cluster/simulate-schedule)",
        r"is not allowed; allowed: --entrypoint",
        "a runtime argument's path value may hold no '..' segment, which its pattern states with a "
        "lookahead; the generator cannot honour lookaheads and sends strings (such as '') outside "
        "the pattern as if inside it",
    ),
    (
        "positive_data_acceptance",
        r"GET /api/v1/usage",
        r"a date \(YYYY-MM-DD\) or an RFC 3339 time",
        "from and to are calendar days or RFC 3339 times: which strings are real dates (no "
        "February 30) is more than a pattern can state, so the document gives the format in words",
    ),
    (
        "positive_data_acceptance",
        r"PUT /api/v1/budgets/(\{team\}|project/\{key\})",
        r"limit_cost or limit_gpu_hours is required",
        "a budget needs one of two limits (or both): a rule across two fields, which OpenAPI 3.0 "
        "describes one by one",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/(jobs|instances)|PATCH /api/v1/users/\{login\}",
        r"no project '",
        "a job, an instance or a user's default may name only a project that exists: which exist "
        "is the server's state, not the document's (the refusal names the field)",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/auth/(device|device/token|login)|PUT /api/v1/auth/bindings",
        r"no oidc provider|no provider '|name the `provider`|no project '",
        "sign-in and binding rules may name only a provider (and projects) that exist: which exist "
        "is the server's state, not the document's",
    ),
    (
        "positive_data_acceptance",
        r"GET /api/v1/auth/(login|callback)/\{provider\}",
        r"no sign-in provider|matches none under way",
        "a browser's sign-in names a provider that exists, and its callback a `state` one of this "
        "browser's sign-ins holds: the server's state, not the document's (the 400 page says so)",
    ),
    (
        "positive_data_acceptance",
        r"PUT /api/v1/auth/providers/\{name\}",
        r"required for kind (oidc|jwt)",
        "an oidc provider needs its client_id and a jwt issuer its audience: a rule across two "
        "fields, which OpenAPI 3.0 describes one by one",
    ),
    (
        "positive_data_acceptance",
        r"PUT /api/v1/auth/bindings",
        r"a rule has exactly one of contains and equals",
        "a rule tests a claim with contains or with equals, not both: a rule across two fields, "
        "which OpenAPI 3.0 describes one by one",
    ),
    (
        "negative_data_rejection",
        r"POST /api/v1/.*",
        r'"code":"payload_too_large"',
        "a body over max_body_bytes is refused 413 before it is parsed: one that also breaks the "
        "schema gets 413, not the 400 the check expects",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/(jobs|instances|tokens|cluster/simulate-schedule"
        r"|projects/\{key\}/service-accounts)",
        r"a name holds no invisible|a name is written in plain characters|a name's letters come "
        r"from one script",
        "a name is in Unicode NFKC form, its letters of one script, with no invisible, format or "
        "separator character (docs/api.md#names): Unicode categories, normalization and scripts "
        "are more than a pattern (without \\p{...}) can state, so the document gives the rule in "
        "words",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/tokens",
        r"tokens_allow_system_users",
        "a unix_user may not be a system account of fleetd's host unless the operator allows it: "
        "which users exist there is the host's state, not the document's",
    ),
    (
        "positive_data_acceptance",
        r"POST /api/v1/agent/heartbeat",
        r"is out of range|nested deeper than",
        "the free-form `metrics` object is held to fleetd's JSON limits for every body (integers "
        "of at most 20 digits, nesting at most 32 deep), which a free-form schema cannot state",
    ),
]

# Generated strings are valid UTF-8 without NUL. fleetd refuses NUL and unpaired surrogates in
# every string by design (PostgreSQL and SQLite's UTF-8 text cannot hold them) and OpenAPI 3.0 has
# no way to say so, so schema-valid cases holding them would be "rejected positive data" that no
# fix can remove. tests/fleetd/api/test_hostile_input.py checks that refusal itself, for every
# route.
GENERATION = ["--generation-codec", "utf-8", "--generation-allow-x00", "false"]

SERVER_ENV = {
    # The ignored_auth check sends wrong tokens on purpose; past the limits on failed
    # authentications (tested in tests/fleetd/test_auth.py) those would be answered 429 instead of
    # 401.
    "FLEETD_AUTH_FAILURE_LIMIT": "1000000000",
    "FLEETD_AUTH_FAILURE_GLOBAL_LIMIT": "1000000000",
    # Registrations past a rate get 429 (tests/fleetd/services/agents/test_agent_protocol.py); the
    # fuzzer registers hosts faster than any storm, and its valid ones must be accepted.
    "FLEETD_MAX_REGISTRATIONS_PER_SECOND": "0",
    # acquire, job wait and rendezvous wait are long polls of up to 30 s; fuzzed cases must not
    # wait.
    "FLEETD_LONG_POLL_MAX_SECONDS": "0.2",
    # Which hosts a webhook may target depends on what they are or resolve to (loopback, private,
    # ...), which a URL's schema cannot state; the fuzzer checks the document,
    # tests/fleetd/services/notify/test_webhook_targets.py checks the refusals.
    "FLEETD_WEBHOOKS_ALLOW_TARGETS": "0.0.0.0/0,::/0",
    # ... and the fuzzed webhooks are never posted to: their targets are anywhere (tests reach only
    # loopback and their own namespaces).
    "FLEETD_WEBHOOK_SEND_SECONDS": "86400",
}


def _start_server(tmp_path):
    data_dir = tmp_path / "fleetd-data"
    admin = fleetd_init(data_dir)
    return FleetdProcess(data_dir, SERVER_ENV).start(), admin


class _Seed(Http):
    """Real objects on the server, so that fuzzed ids sometimes name something that exists; calls
    are made as the admin unless `token` says otherwise."""

    def fleet_and_join_token(self, name="gpu-a"):
        self("POST", "/api/v1/fleets", json={"name": name, "labels": {"zone": "z1"}}, expect=201)
        return self("POST", f"/api/v1/fleets/{name}/join-tokens", json={}, expect=201).json()[
            "token"
        ]

    def register(self, join, machine_id, gpu_count=2):
        body = {
            "hostname": f"host-{machine_id}",
            "machine_id": machine_id,
            "agent_version": "0.1.0",
            "address": "10.0.0.1",
            "resources": {"cpu_count": 64, "memory_bytes": 512 * 1024**3},
            "gpus": gpus(gpu_count),
        }
        if gpu_count:
            for gpu in body["gpus"]:
                gpu["uuid"] = gpu["uuid"].replace("GPU-", f"GPU-{machine_id}-")
        return self(
            "POST", "/api/v1/agent/register", token=join, agent=True, json=body, expect=201
        ).json()

    def submit(self, name="seed-job"):
        spec = {"name": name, "command": ["sleep", "600"], "resources": {"gpus": 1}}
        return self("POST", "/api/v1/jobs", json=spec, expect=201).json()


def _toml(value):
    return json.dumps(value)  # a JSON string or list of strings is a valid TOML value


def _write_config(path, *, headers, operations=(), dictionaries=None, parameters=None):
    """schemathesis.toml: global headers, per-operation headers and pinned parameters,
    dictionaries."""
    lines = [
        "headers = { " + ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in headers.items()) + " }"
    ]
    if parameters:
        bound = [
            f"{_toml(k)} = {{ dictionary = {_toml(d)}, probability = {p} }}"
            for k, (d, p) in parameters.items()
        ]
        lines.append("parameters = { " + ", ".join(bound) + " }")
    for name, values in (dictionaries or {}).items():
        lines += ["", f"[dictionaries.{name}]", f"values = {json.dumps(values)}"]
    for op in operations:
        lines += ["", "[[operations]]", f"include-path-regex = {_toml(op['path_regex'])}"]
        if "method" in op:
            lines.append(f"include-method = {_toml(op['method'])}")
        if "headers" in op:
            lines.append(
                "headers = { "
                + ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in op["headers"].items())
                + " }"
            )
        if "pinned" in op:
            lines.append(
                "parameters = { "
                + ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in op["pinned"].items())
                + " }"
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def _run_schemathesis(server, config, report_dir, *select):
    """Run the CLI with every check and every phase; returns (completed process, NDJSON path,
    seconds)."""
    cmd = [
        SCHEMATHESIS,
        "--config-file",
        str(config),
        "run",
        server.url + "/api/openapi.json",
        "--checks",
        "all",
        "--phases",
        PHASES,
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        str(SEED),
        "--workers",
        "1",
        "--request-timeout",
        "10",
        "--suppress-health-check",
        "all",
        "--continue-on-failure",
        "--generation-database",
        "none",
        *GENERATION,
        "--report",
        "ndjson",
        "--report-dir",
        str(report_dir),
        "--output-truncate",
        "true",
        *select,
    ]
    started = time.monotonic()
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        cwd=report_dir.parent,
        env=dict(os.environ, NO_COLOR="1"),
    )
    elapsed = time.monotonic() - started
    reports = sorted(Path(report_dir).glob("*.ndjson"))
    assert reports, (
        f"no report (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc, reports[-1], elapsed


def _decode(content):
    if not content:
        return ""
    if "$base64" in content:
        return base64.b64decode(content["$base64"]).decode("utf-8", "replace")
    return content.get("string", "")


def _first_line(message):
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    # Keep the check's verdict and the component it blamed; drop the generic 'Expected: ...' lists.
    kept = [line for line in lines if not line.startswith("Expected")]
    return " | ".join(kept[:2])[:300]


def _signature(text):
    """What a response body says, without the values that differ from case to case: the error code
    and each "field path: message", with odd keys and quoted values blanked."""
    try:
        error = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    said = set()

    def walk(value, path):
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, path + (key if re.fullmatch(r"[A-Za-z_][\w-]*", key) else "<key>",))
        elif isinstance(value, list):
            for message in value:
                if isinstance(message, (dict, list)):
                    walk(message, path)
                else:
                    said.add(".".join(path) + ": " + re.sub(r"'[^']*'", "'…'", str(message)))

    fields = (error.get("details") or {}).get("fields")
    if fields:
        walk(fields, ())
    else:
        said.add(re.sub(r"\d+", "#", str(error.get("message"))))
    return error.get("code"), tuple(sorted(said))


def collect_failures(ndjson_path):
    """Every failing check in a run, deduplicated by (operation, check, verdict); one example
    each."""
    found = {}
    errors = []
    with open(ndjson_path) as fh:
        for line in fh:
            event = json.loads(line)
            if "NonFatalError" in event or "FatalError" in event:
                errors.append(json.dumps(event)[:1000])
                continue
            finished = event.get("ScenarioFinished")
            if not finished:
                continue
            recorder = finished["recorder"]
            for case_id, checks in recorder.get("checks", {}).items():
                for check in checks:
                    if check["status"] != "failure":
                        continue
                    failure = check["failure_info"]["failure"]
                    operation = failure.get("operation") or recorder["label"]
                    verdict = f"{failure.get('code', '')} {failure.get('title', '')}: "
                    verdict += _first_line(failure.get("message"))
                    interaction = recorder.get("interactions", {}).get(case_id) or {}
                    response = interaction.get("response") or {}
                    text = _decode(response.get("content"))
                    key = (
                        operation,
                        check["name"],
                        verdict,
                        response.get("status_code"),
                        _signature(text),
                    )
                    if key in found:
                        found[key]["count"] += 1
                        continue
                    case = recorder["cases"].get(case_id, {}).get("value", {})
                    request = interaction.get("request") or {}
                    found[key] = {
                        "operation": operation,
                        "check": check["name"],
                        "verdict": verdict,
                        "phase": finished.get("phase"),
                        "count": 1,
                        "request": {
                            k: case[k]
                            for k in ("path_parameters", "query", "headers", "body")
                            if k in case
                        },
                        "uri": request.get("uri"),
                        "status": response.get("status_code"),
                        "response": text[:300],
                        "response_full": text,  # what ALLOWED is matched against
                    }
    return list(found.values()), errors


def _allowed(failure):
    return next(
        (
            reason
            for check, op_re, response_re, reason in ALLOWED
            if check == failure["check"]
            and re.fullmatch(op_re, failure["operation"])
            and re.search(response_re, failure["response_full"])
        ),
        None,
    )


def _json_schema(node, components, depth=0):
    """An OpenAPI 3.0 schema as plain JSON Schema (draft 4): $refs inlined, `nullable` as a null
    type."""
    assert depth < 50, "recursive schema"
    if isinstance(node, list):
        return [_json_schema(item, components, depth + 1) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _json_schema(components[node["$ref"].rsplit("/", 1)[-1]], components, depth + 1)
    out = {k: _json_schema(v, components, depth + 1) for k, v in node.items() if k != "nullable"}
    if node.get("nullable"):
        out = {"anyOf": [out, {"type": "null"}]}
    return out


def mislabelled(spec, failure):
    """Why a 'schema-valid request rejected' case was not schema-valid at all, or None.

    Schemathesis 4.32 sometimes labels a body positive that its own schema forbids (seen: an extra
    top-level "error" property on schemas with additionalProperties: false). Refusing such a body is
    right, so the failure is the tool's, not fleetd's; it is counted and shown, never asserted on.
    """
    if failure["check"] != "positive_data_acceptance" or "body" not in failure["request"]:
        return None
    method, path = failure["operation"].split(" ", 1)
    operation = spec["paths"].get(path, {}).get(method.lower(), {})
    schema = (
        (operation.get("requestBody") or {})
        .get("content", {})
        .get("application/json", {})
        .get("schema")
    )
    if schema is None:
        return None
    schema = _json_schema(schema, spec.get("components", {}).get("schemas", {}))
    errors = list(jsonschema_rs.Draft4Validator(schema).iter_errors(failure["request"]["body"]))
    return (
        "; ".join(f"{'/'.join(map(str, e.instance_path))}: {e.message[:200]}" for e in errors[:3])
        or None
    )


def _report(failures, errors, proc, ndjson_path, elapsed):
    lines = [f"{len(failures)} distinct failing checks in {elapsed:.0f} s (events: {ndjson_path}):"]
    for f in sorted(failures, key=lambda f: (f["operation"], f["check"])):
        lines.append(
            f"- {f['operation']} [{f['check']}] x{f['count']} ({f['phase']}): {f['verdict']}"
        )
        lines.append(f"    request {json.dumps(f['request'], default=str)[:400]}")
        lines.append(f"    -> {f['status']} {f['response']}")
    for error in errors:
        lines.append(f"- error: {error}")
    if not failures and not errors:
        lines.append(proc.stdout[-3000:])
    return "\n".join(lines)


def _assert_clean(spec, proc, ndjson_path, elapsed, still_works):
    failures, errors = collect_failures(ndjson_path)
    tools = [(f, why) for f in failures for why in [mislabelled(spec, f)] if why]
    unexpected = [f for f in failures if not _allowed(f) and not mislabelled(spec, f)]
    message = _report(unexpected, errors, proc, ndjson_path, elapsed)
    message += "".join(
        f"\n(not counted: {f['operation']} sent a body outside its own schema: {why})"
        for f, why in tools
    )
    print(message)
    assert not unexpected and not errors, message
    # A clean run that lost its credentials half-way would have tested nothing after that point.
    assert still_works(), (
        "the run's own token stopped working during the run; its later cases tested nothing"
    )
    # 1 is "failures found", all of them allowed above; anything else is the tool failing to run.
    assert proc.returncode == 0 or (proc.returncode == 1 and failures), message


@pytest.mark.timeout(RUN_TIMEOUT + 120)  # the run's own bound, not pytest's default 300 s
def test_api_routes_pass_every_schemathesis_check(tmp_path):
    """Admin token on every non-agent route: no server error, no spec violation, stateful phase
    on."""
    server, admin = _start_server(tmp_path)
    try:
        seed = _Seed(server.url, admin)
        join = seed.fleet_and_join_token("gpu-a")
        node = seed.register(join, "m1")["node_id"]
        job = seed.submit()["id"]
        artifact = seed(
            "PUT",
            "/api/v1/artifacts",
            data=b"seed artifact",
            headers={"X-Artifact-Name": "seed.txt", "X-Artifact-Kind": "file"},
            expect=201,
        )
        victim = seed(
            "POST", "/api/v1/tokens", json={"name": "victim", "role": "submitter"}, expect=201
        ).json()
        config = _write_config(
            tmp_path / "schemathesis.toml",
            headers={"Authorization": f"Bearer {admin}"},
            dictionaries={
                "nodes": [node],
                "jobs": [job],
                "fleets": ["gpu-a"],
                "artifacts": [artifact.json()["sha256"]],
                "models": [gpus(1)[0]["model"]],
            },
            parameters={
                "path.node_id": ("nodes", 0.5),
                "path.job_id": ("jobs", 0.5),
                "path.name": ("fleets", 0.5),
                "path.sha256": ("artifacts", 0.5),
                "path.model": ("models", 0.3),
            },
            operations=[
                # Revoking the token this run authenticates with would leave every later case a 401;
                # the route itself is covered by tests/fleetd/test_auth.py. Deletion is aimed at
                # another token.
                {
                    "path_regex": r"^/api/v1/tokens/\{token_id\}$",
                    "pinned": {"path.token_id": victim["id"]},
                },
            ],
        )
        proc, ndjson_path, elapsed = _run_schemathesis(
            server, config, tmp_path / "report", "--exclude-path-regex", "^/api/v1/agent/"
        )
        _assert_clean(
            seed("GET", "/api/openapi.json", expect=200).json(),
            proc,
            ndjson_path,
            elapsed,
            lambda: seed("GET", "/api/v1/whoami").status_code == 200,
        )
    finally:
        server.kill()


@pytest.mark.timeout(RUN_TIMEOUT + 120)  # the run's own bound, not pytest's default 300 s
def test_agent_routes_pass_every_schemathesis_check(tmp_path):
    """Agent protocol routes with a join token (register) and node session tokens (the rest)."""
    server, admin = _start_server(tmp_path)
    try:
        seed = _Seed(server.url, admin)
        join = seed.fleet_and_join_token("gpu-a")
        session = seed.register(join, "m1", gpu_count=2)["session_token"]
        leaver = seed.register(join, "m2", gpu_count=0)["session_token"]
        seed(
            "POST",
            "/api/v1/agent/heartbeat",
            token=session,
            agent=True,
            json={"tasks": []},
            expect=200,
        )
        job = seed.submit()
        # The scheduler places the job within a pass; each acquire waits up to 1 s for it.
        assignment = wait_until(
            lambda: seed(
                "POST",
                "/api/v1/agent/acquire",
                token=session,
                agent=True,
                json={"wait_seconds": 1},
                expect=200,
            ).json()["assignment"],
            20,
            0.01,
            f"an assignment of job {job['id']}",
            details=lambda: seed("GET", f"/api/v1/jobs/{job['id']}").json(),
        )
        seed(
            "POST",
            f"/api/v1/agent/tasks/{assignment['task_id']}/start",
            token=session,
            agent=True,
            json={"epoch": assignment["epoch"], "pid": 4242},
            expect=204,
        )
        protocol = {"X-Fleet-Protocol": "1"}
        config = _write_config(
            tmp_path / "schemathesis.toml",
            headers={"Authorization": f"Bearer {session}", **protocol},
            dictionaries={"tasks": [assignment["task_id"]], "epochs": [assignment["epoch"]]},
            parameters={"path.task_id": ("tasks", 0.6), "body.epoch": ("epochs", 0.5)},
            operations=[
                {
                    "path_regex": r"^/api/v1/agent/register$",
                    "headers": {"Authorization": f"Bearer {join}", **protocol},
                },
                # Deregistering ends the session it is sent with: a node of its own keeps the other
                # routes' one.
                {
                    "path_regex": r"^/api/v1/agent/deregister$",
                    "headers": {"Authorization": f"Bearer {leaver}", **protocol},
                },
            ],
        )
        proc, ndjson_path, elapsed = _run_schemathesis(
            server, config, tmp_path / "report", "--include-path-regex", "^/api/v1/agent/"
        )
        _assert_clean(
            seed("GET", "/api/openapi.json", expect=200).json(),
            proc,
            ndjson_path,
            elapsed,
            lambda: (
                seed(
                    "POST", "/api/v1/agent/heartbeat", token=session, agent=True, json={"tasks": []}
                ).status_code
                == 200
            ),
        )
    finally:
        server.kill()


@pytest.mark.timeout(RUN_TIMEOUT + 120)  # the run's own bound, not pytest's default 300 s
def test_graphql_documents_from_the_schema_give_no_internal_error(tmp_path):
    """Schemathesis's GraphQL fuzzing over every query and mutation of /graphql (its schema read by
    introspection), with an admin token against a fleet with a node and a job: no 5xx and no error
    coded `internal` (tests/integration/schemathesis_graphql_hooks.py says why its own server-error
    check is replaced)."""
    server, admin = _start_server(tmp_path)
    try:
        seed = _Seed(server.url, admin)
        seed.register(seed.fleet_and_join_token("gpu-a"), "m1")
        seed.submit()
        config = _write_config(
            tmp_path / "schemathesis.toml", headers={"Authorization": f"Bearer {admin}"}
        )
        cmd = [
            SCHEMATHESIS,
            "--config-file",
            str(config),
            "run",
            server.url + "/graphql",
            "--checks",
            "no_internal_graphql_error",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            str(SEED),
            "--workers",
            "1",
            "--request-timeout",
            "10",
            "--suppress-health-check",
            "all",
            "--continue-on-failure",
            "--generation-database",
            "none",
        ]
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            cwd=tmp_path,
            env=dict(
                os.environ,
                NO_COLOR="1",
                SCHEMATHESIS_HOOKS="tests.integration.schemathesis_graphql_hooks",
                PYTHONPATH=str(Path(__file__).resolve().parents[2]),
            ),
        )
        assert proc.returncode == 0 and re.search(r"\d+ passed", proc.stdout), (
            proc.stdout[-6000:] + proc.stderr[-2000:]
        )
        assert seed("GET", "/api/v1/whoami").status_code == 200
    finally:
        server.kill()
