"""Bounds on a GraphQL document, checked before anything runs: its depth and its cost."""

from ariadne.validation import cost_validator
from graphql import (
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    OperationDefinitionNode,
)
from graphql.validation import ValidationRule

MAX_DEPTH = 15  # the deepest of fleetd's own selections is 5; the standard introspection query needs 13
MAX_COST = 2000  # each field selected counts 1: a full pod is ~50, introspection ~200


class DepthLimit(ValidationRule):
    """Refuse an operation whose selections nest deeper than MAX_DEPTH (fragments followed)."""

    def enter_operation_definition(self, node: OperationDefinitionNode, *_args):
        fragments = {f.name.value: f for f in self.context.document.definitions if isinstance(f, FragmentDefinitionNode)}
        depth = _depth(node.selection_set, fragments, 0, set())
        if depth > MAX_DEPTH:
            name = node.name.value if node.name else "anonymous"
            self.report_error(GraphQLError(
                f"operation {name!r} nests {depth} levels deep; at most {MAX_DEPTH} are allowed", node))


def _depth(selection_set, fragments, level, seen):
    if selection_set is None or level > MAX_DEPTH:
        return level
    deepest = level
    for selection in selection_set.selections:
        if isinstance(selection, FieldNode):
            inner = level + 1 if selection.selection_set is not None else level
            deepest = max(deepest, _depth(selection.selection_set, fragments, inner, seen))
        elif isinstance(selection, InlineFragmentNode):
            deepest = max(deepest, _depth(selection.selection_set, fragments, level, seen))
        elif isinstance(selection, FragmentSpreadNode) and selection.name.value not in seen:
            fragment = fragments.get(selection.name.value)
            if fragment is not None:  # an unknown one is reported by graphql's own rules
                deepest = max(deepest, _depth(fragment.selection_set, fragments, level,
                                              seen | {selection.name.value}))
    return deepest


def rules(variables=None):
    """The validation rules added to GraphQL's own for one request."""
    return [DepthLimit, cost_validator(maximum_cost=MAX_COST, default_cost=1, variables=variables)]
