"""What a schema costs to convert is bounded by design: each definition merged once however often
allOf names it, lists handled with sets, no recursion as deep as the properties, a limit on the
grammar a schema may expand to, and the request's deadline checked while it converts. The cost is
counted here (calls), not timed."""

from __future__ import annotations

import pytest

from bubo import deadline
from bubo.chat import schema as sc


def doubling_all_of(depth: int, extra: bool = False) -> dict:
    """d_i is allOf [d_{i-1}, d_{i-1}] (and with extra, a property of type d_{i-1}): expanded, 2^depth."""
    defs: dict = {"d0": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}
    for i in range(1, depth + 1):
        branches: list = [{"$ref": f"#/$defs/d{i - 1}"}, {"$ref": f"#/$defs/d{i - 1}"}]
        if extra:
            branches.append({"properties": {f"p{i}": {"$ref": f"#/$defs/d{i - 1}"}}})
        defs[f"d{i}"] = {"allOf": branches}
    return {"$defs": defs, "$ref": f"#/$defs/d{depth}"}


def nested_all_of(depth: int) -> dict:
    """The same shape inline: allOf of two copies of the level below, nested depth deep."""
    node: dict = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for _ in range(depth):
        node = {"allOf": [node, node]}  # one object twice: JSON parsing would make two equal ones
    return node


@pytest.fixture
def merges(monkeypatch):
    calls = []
    real = sc._Converter._merge_all_of

    def counted(self, schema, ptr):
        calls.append(ptr)
        assert len(calls) < 1000, "allOf merged again and again: the conversion grows exponentially"
        return real(self, schema, ptr)

    monkeypatch.setattr(sc._Converter, "_merge_all_of", counted)
    return calls


@pytest.mark.parametrize("schema,most", [
    (doubling_all_of(40), 41),
    (doubling_all_of(25, extra=True), 26),
    (nested_all_of(40), 41),
], ids=["refs-doubling-40", "refs-with-properties-25", "inline-40"])
def test_all_of_is_merged_once_per_definition(merges, schema, most):
    gbnf = sc.schema_to_gbnf(schema)
    assert "root ::=" in gbnf
    assert len(merges) <= most, len(merges)


def test_a_long_ref_chain_is_followed_once():
    defs = {f"c{i}": {"$ref": f"#/$defs/c{i + 1}"} for i in range(200)}
    defs["c200"] = {"type": "integer"}
    schema = {"$defs": defs, "allOf": [{"$ref": "#/$defs/c0"}] * 3, "type": "object",
              "properties": {f"k{j}": {"type": "string"} for j in range(50)}}
    c = sc._Converter(schema)
    resolved = []
    real = c.resolve
    c.resolve = lambda ref, ptr: resolved.append(ref) or real(ref, ptr)  # type: ignore[method-assign]
    for _ in range(100):
        c.deref({"$ref": "#/$defs/c0"}, "/x")
    assert len(resolved) <= 201  # the first deref walks the chain; the others are remembered


def test_many_properties_and_required_names_convert_without_deep_recursion():
    n = 5000  # past Python's recursion limit, which the old per-property recursion hit
    schema = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(n)},
              "required": [f"k{i}" for i in range(0, n, 2)]}
    gbnf = sc.schema_to_gbnf(schema)
    assert gbnf.count('"\\"k4999\\""') == 1


def test_property_names_that_sanitize_alike_get_distinct_rules():
    schema = {"type": "object", "properties": {"k" + "." * i: {"type": "integer"} for i in range(300)}}
    gbnf = sc.schema_to_gbnf(schema)
    names = [line.split(" ::= ")[0] for line in gbnf.splitlines()]
    assert len(names) == len(set(names))
    assert sum(1 for line in gbnf.splitlines() if '":" ws' in line) == 300  # one rule per property


def test_one_of_thousands_of_discriminated_branches_is_checked_as_disjoint():
    branches = [{"type": "object", "properties": {"t": {"const": i}, "v": {"type": "string"}}, "required": ["t"]}
                for i in range(3000)]
    gbnf = sc.schema_to_gbnf({"oneOf": branches})
    assert gbnf.count("root-2999") >= 1
    # and two branches that can match the same instance are still refused
    with pytest.raises(sc.SchemaError, match="oneOf branches"):
        sc.schema_to_gbnf({"oneOf": branches + [{"type": "object", "properties": {"t": {"const": 7}},
                                                 "required": ["t"]}]})


def test_a_schema_that_expands_past_the_limit_is_refused_at_the_root():
    schema = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(60_000)},
              "required": [f"k{i}" for i in range(60_000)]}
    with pytest.raises(sc.SchemaError) as e:
        sc.schema_to_gbnf(schema)
    assert e.value.pointer == "/" and "expands to a grammar of more than" in e.value.reason


def test_conversion_stops_once_its_deadline_has_passed():
    budget = deadline.Budget(0.0, "test")
    with deadline.running(budget):
        budget.deadline = 0.0  # spent
        with pytest.raises(deadline.Abandoned):
            sc.schema_to_gbnf({"type": "object", "properties": {"a": {"type": "integer"}}})
    # outside a budget the checks cost nothing and change nothing
    assert "root ::=" in sc.schema_to_gbnf({"type": "object", "properties": {"a": {"type": "integer"}}})


def test_disjoint_and_apart_agree_with_the_pairwise_definitions():
    import itertools
    import random

    rng = random.Random(4)
    types = ["object", "array", "string", "number", "integer", "boolean", "null"]
    for _ in range(2000):
        n = rng.randint(1, 5)
        sets = [set(rng.sample(types, rng.randint(0, 3))) if rng.random() > 0.1 else None for _ in range(n)]
        pairwise = all(s is not None for s in sets) and all(
            not (sets[i] & sets[j]) for i, j in itertools.combinations(range(n), 2))  # type: ignore[operator]
        assert sc._disjoint(sets) == pairwise
        gen = [set(rng.sample(types, rng.randint(0, 2))) for _ in range(n)]
        adm = [set(rng.sample(types, rng.randint(0, 3))) for _ in range(n)]
        want = all(not (sc._widen(gen[i]) & sc._widen(adm[j])) for i in range(n) for j in range(n) if i != j)
        assert sc._apart(gen, adm) == want  # type: ignore[arg-type]
