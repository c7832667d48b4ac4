"""Run in a venv of its own with the `runpod` SDK (tests/agent/test_graphql_e2e.py makes it): one
SDK call per line read from stdin ({"call", "args", "kwargs"} as JSON), its result or its error as
one JSON line on stdout after the marker. RUNPOD_API_BASE_URL names fleetd; FLEETD_TOKEN is the
key."""

import json
import os
import sys

import runpod

MARKER = "RESULT "
CALLS = (
    "create_pod",
    "get_pods",
    "get_pod",
    "stop_pod",
    "resume_pod",
    "terminate_pod",
    "get_gpus",
    "get_gpu",
    "get_user",
)


def main():
    runpod.api_key = os.environ["FLEETD_TOKEN"]
    for line in sys.stdin:
        request = json.loads(line)
        if request["call"] not in CALLS:
            answer = {"error": "UnknownCall", "message": request["call"]}
        else:
            try:
                answer = {
                    "result": getattr(runpod, request["call"])(
                        *request.get("args", ()), **request.get("kwargs", {})
                    )
                }
            except Exception as exc:  # noqa: BLE001 - every error goes back to the test as data
                answer = {"error": type(exc).__name__, "message": str(exc)}
        print(MARKER + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
