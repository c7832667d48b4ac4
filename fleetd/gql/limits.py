"""Bounds on a GraphQL document, checked before it runs and in time linear in its size.

`prepare` is what a request calls, off the event loop (fleetd serve's worker threads): it refuses a
document over MAX_BYTES at once, parses with at most MAX_TOKENS tokens, counts its definitions, and
measures each operation's depth and cost through its fragments, each fragment measured once however
many times it is spread (a chain of fragments that doubles at every step costs 2^n, known in n
steps). Only then do GraphQL's own validation rules run, over a document these bounds keep small.
Every refusal is a `Refused` naming the limit.
"""

import re
from dataclasses import dataclass

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLSchema,
    InlineFragmentNode,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    parse,
    validate,
)
from graphql.validation import specified_rules

MAX_BYTES = 64 * 1024  # the document's text, UTF-8
MAX_TOKENS = 5000  # GraphQL's lexical tokens (names, punctuation, values)
MAX_DEFINITIONS = 100  # operations and fragments
# Fields nested in fields, through fragments (introspection aside); fleetd's own deepest is 5.
MAX_DEPTH = 12
# Every selected field costs 1 (__typename and introspection too), a fragment at each spread.
MAX_COST = 10_000


# Introspection nests deeper than any of fleetd's fields (a type's ofType chain: the standard query
# of GraphQL tools is 14 levels deep) and is bounded by GraphQL's own MaxIntrospectionDepthRule: its
# depth does not count here, its cost does.
_INTROSPECTION = frozenset({"__schema", "__type"})


class Refused(Exception):
    """The document breaks a limit; the message names it."""


@dataclass(frozen=True)
class Prepared:
    """A document that passed the limits, with GraphQL's own validation errors (empty: it may
    run)."""

    document: DocumentNode
    errors: list[GraphQLError]
    mutation: bool  # the operation the request selects is a mutation


def check_size(query: str) -> None:
    """Refuse a document over MAX_BYTES before anything reads it."""
    # A character is at most 4 bytes in UTF-8: only a long text is encoded to be sure.
    if len(query) > MAX_BYTES // 4 and len(query.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise Refused(f"the GraphQL document is over {MAX_BYTES:,} bytes (the size limit)")


# GraphQL's lexical tokens as one regular expression (the spec's Lexical Tokens): block strings and
# strings whole, numbers, names, punctuators; comments, white space and commas match as ignored. A
# string's closing quotes are optional, so that an unterminated one is one token (the parser refuses
# it) and no input makes the expression scan the rest of the text again from each quote.
_TOKENS = re.compile(
    r'''
    (?P<ignored>\#[^\n\r]*|[\s,\ufeff]+)
  | """(?:\\"""|[^"]|"(?!""))*(?:""")?
  | "(?:\\.|[^"\\\n\r])*"?
  | -?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?
  | [_A-Za-z][_0-9A-Za-z]*
  | \.\.\.
  | [!$&()\:=@\[\]{|}]
''',
    re.VERBOSE,
)


def count_tokens(query: str, most: int = MAX_TOKENS) -> int:
    """GraphQL's tokens in `query`, counted in C by one regular expression, up to `most` + 1: a
    document far over the limit is refused without the (pure Python) parser building a node for each
    token."""
    count = 0
    for match in _TOKENS.finditer(query):
        if match.lastgroup != "ignored":
            count += 1
            if count > most:
                break
    return count


def prepare(schema: GraphQLSchema, query: str, operation_name: str | None) -> Prepared:
    """Parse, bound and validate a document (pure CPU work: fleetd serve runs it in a worker
    thread). Raise Refused for a broken limit; a syntax error is a GraphQLError, as GraphQL reports
    it."""
    check_size(query)
    if count_tokens(query) > MAX_TOKENS:
        raise Refused(f"the GraphQL document has more than {MAX_TOKENS:,} tokens (the token limit)")
    try:
        document = parse(query, max_tokens=MAX_TOKENS)
    except GraphQLError as exc:
        if "more than" in exc.message and "tokens" in exc.message:
            raise Refused(
                f"the GraphQL document has more than {MAX_TOKENS:,} tokens (the token limit)"
            ) from None
        raise
    definitions = document.definitions
    if len(definitions) > MAX_DEFINITIONS:
        raise Refused(
            f"the GraphQL document has {len(definitions):,} definitions; at most {MAX_DEFINITIONS}"
            " are allowed (the definition limit)"
        )
    measure = _Measure(
        {d.name.value: d for d in definitions if isinstance(d, FragmentDefinitionNode)}
    )
    for definition in definitions:
        if isinstance(definition, OperationDefinitionNode):
            name = repr(definition.name.value) if definition.name else "anonymous"
            cost, depth = measure.selections(definition.selection_set)
            if depth > MAX_DEPTH:
                raise Refused(
                    f"operation {name} nests {depth} levels deep; at most {MAX_DEPTH} are allowed"
                    " (the depth limit, fragments followed)"
                )
            if cost > MAX_COST:
                raise Refused(
                    f"operation {name} costs over {MAX_COST:,}: each selected field counts 1, a"
                    f" fragment at each of its spreads (the cost limit)"
                )
    return Prepared(
        document,
        validate(schema, document, specified_rules),
        _selects_mutation(document, operation_name),
    )


class _Measure:
    """Cost and depth of selection sets, each fragment measured once (memoised by name)."""

    def __init__(self, fragments: dict[str, FragmentDefinitionNode]):
        self.fragments = fragments
        self.known: dict[str, tuple[int, int]] = {}
        self.open: set[str] = set()  # fragments being measured: spreading one again is a cycle

    def selections(self, selection_set: SelectionSetNode | None) -> tuple[int, int]:
        """(cost, depth): fields selected, fragments expanded, and how many levels of fields
        nest."""
        if selection_set is None:
            return 0, 0
        cost = depth = 0
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                inner_cost, inner_depth = self.selections(selection.selection_set)
                cost += 1 + inner_cost
                if selection.name.value not in _INTROSPECTION:
                    depth = max(
                        depth, inner_depth + 1 if selection.selection_set is not None else 0
                    )
            elif isinstance(selection, InlineFragmentNode):
                inner_cost, inner_depth = self.selections(selection.selection_set)
                cost, depth = cost + inner_cost, max(depth, inner_depth)
            elif isinstance(selection, FragmentSpreadNode):
                inner_cost, inner_depth = self.fragment(selection.name.value)
                cost, depth = cost + inner_cost, max(depth, inner_depth)
            cost = min(cost, MAX_COST + 1)  # past the limit the exact figure does not matter
            if depth > MAX_DEPTH:
                break
        return cost, depth

    def fragment(self, name: str) -> tuple[int, int]:
        if name in self.known:
            return self.known[name]
        fragment = self.fragments.get(name)
        if fragment is None:  # an unknown fragment: GraphQL's own rules report it
            return 0, 0
        if name in self.open:
            raise Refused(f"fragment {name!r} spreads itself")
        self.open.add(name)
        self.known[name] = self.selections(fragment.selection_set)
        self.open.discard(name)
        return self.known[name]


def _selects_mutation(document: DocumentNode, operation_name: str | None) -> bool:
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    chosen = [
        o
        for o in operations
        if operation_name is None or (o.name and o.name.value == operation_name)
    ]
    return len(chosen) == 1 and chosen[0].operation == OperationType.MUTATION
