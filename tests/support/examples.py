"""How many examples a property test tries: all of them in the whole suite, a fifth (at least 5)
in the fast tier, which `scripts/test.sh --fast` selects with FLEETD_TESTS_FAST=1. The whole suite
(`.ci/run`) always runs every example."""

import os

FAST = os.environ.get("FLEETD_TESTS_FAST") == "1"


def examples(count):
    """`count` examples, or a fifth of them in the fast tier."""
    return max(5, count // 5) if FAST else count
