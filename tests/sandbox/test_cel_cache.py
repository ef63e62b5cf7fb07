"""The CEL result cache never answers differently from evaluating the rule afresh.

Its key is the expression plus the parts of the variables the expression reads, found by reading the
expression's text; a mistake there (a method taken for a field, an index, a non-map in the middle of a
path) would reuse a verdict for an input that deserves another. Hypothesis draws the inputs from a
small universe, so distinct inputs with equal projections come up often.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from deviceshare.sandbox import cel
from tests.api.test_crd_agreement import crd


def rules(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [r["rule"] for r in node.get("x-kubernetes-validations") or []]
        return own + [r for v in node.values() for r in rules(v)]
    if isinstance(node, list):
        return [r for v in node for r in rules(v)]
    return []


CRD_RULES = rules(crd())
assert len(CRD_RULES) >= 3, CRD_RULES

EXPRESSIONS = [
    *CRD_RULES,  # as shipped (the root ones see spec and status as drawn below)
    "!has(oldSelf.status) || !has(oldSelf.status.phase) || "
    "!(oldSelf.status.phase in ['Bound', 'Releasing']) || self.spec.resources == oldSelf.spec.resources",
    "self.all(k, size(k) <= 3)",
    "self.spec.all(k, k != 'b')",
    "has(self.spec.a) && self.spec.a == 1",
    "self.spec.a.b == 1",
    "size(self.spec) < 2",
    "self.spec.exists(k, self.spec[k] == 1)",
    "self.spec == oldSelf.spec",
    "has(self.status) ? self.status.phase == 'Bound' : true",
    "has(self.spec.a.b) || has(oldSelf.spec.c)",
    "has(self.spec.a) && has(self.spec.a.a) && self.spec.a.a != 0",
    "has( self.spec.b ) ? size(self.spec) == 1 : has(self.status.members)",
]

leaf = st.one_of(st.integers(0, 2), st.sampled_from(["a", "b", "Bound", "Releasing"]), st.booleans())
value = st.recursive(leaf, lambda inner: st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
                     max_leaves=6)
obj = st.fixed_dictionaries(
    {"spec": value},
    optional={"status": st.fixed_dictionaries({}, optional={"phase": st.sampled_from(["Bound", "Pending"]),
                                                          "members": st.lists(st.sampled_from(["p", "q"]))})},
)


def verdict(expression: str, variables: dict[str, Any], *, cached: bool) -> bool | str:
    try:
        return cel.is_true(expression, variables) if cached else cel._is_true(expression, variables)
    except cel.CelError:
        return "error"


@settings(max_examples=300, deadline=None)
@given(expression=st.sampled_from(EXPRESSIONS), new=obj, old=obj)
def test_a_cached_verdict_is_the_verdict(expression: str, new: dict[str, Any], old: dict[str, Any]) -> None:
    variables = {"self": new, "oldSelf": old}
    assert verdict(expression, variables, cached=True) == verdict(expression, variables, cached=False)


def test_a_status_only_change_reuses_the_verdict_of_rules_that_read_spec() -> None:
    rule = "self.spec.a == oldSelf.spec.a"
    before = len(cel._results)
    cel.is_true(rule, {"self": {"spec": {"a": 1}, "status": {"n": 1}}, "oldSelf": {"spec": {"a": 1}}})
    cel.is_true(rule, {"self": {"spec": {"a": 1}, "status": {"n": 2}}, "oldSelf": {"spec": {"a": 1}}})
    assert len(cel._results) == before + 1
    assert not cel.is_true(rule, {"self": {"spec": {"a": 2}, "status": {"n": 2}}, "oldSelf": {"spec": {"a": 1}}})


def test_reads_cut_method_calls_and_indexes() -> None:
    assert cel._reads("self.spec.resources.all(k, k != '')")["self"] == ((("spec", "resources"), False),)
    assert cel._reads("self.all(k, true)")["self"] == (((), False),)
    assert cel._reads("self.a[0].b == 1")["self"] == ((("a",), False),)


def test_has_reads_only_whether_the_field_is_there() -> None:
    assert cel._reads("has(self.status) && has(self.status.phase)")["self"] == (
        (("status",), True), (("status", "phase"), True),
    )
    assert cel._reads("has(self.a.b.exists(x, x))")["self"] == ((("a", "b"), False),)
