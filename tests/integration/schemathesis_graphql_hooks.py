"""Schemathesis hooks for the GraphQL run
(SCHEMATHESIS_HOOKS=tests.integration.schemathesis_graphql_hooks).

Schemathesis's own `not_a_server_error` counts every resolver error as a server error, and fleetd's
GraphQL reports an expected outcome (a pod not found, a bid under the minimum) as an error with its
REST code, as the GPU-cloud API it speaks does. This check keeps what matters: no 5xx, and no error
whose code is `internal` (an unexpected exception in a resolver)."""

import schemathesis


@schemathesis.check
def no_internal_graphql_error(ctx, response, case):
    """No 5xx, and every GraphQL error carries an expected code (never `internal`)."""
    if response.status_code >= 500:
        raise AssertionError(f"server error {response.status_code}")
    try:
        body = response.json()
    except ValueError:
        raise AssertionError("the answer is not JSON") from None
    for error in body.get("errors") or []:
        code = (error.get("extensions") or {}).get("code")
        if code in (None, "internal"):
            raise AssertionError(
                f"GraphQL error without an expected code: {error.get('message')!r}"
            )
