"""The checks every fleetwire message's from_wire makes of a JSON value (a bool is no number)."""

from typing import TypeGuard


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
