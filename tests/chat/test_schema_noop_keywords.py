"""Keyword values that constrain nothing are accepted (bubo.chat.schema, _Converter.noop): the
grammar is the one of the schema without them, and what it accepts validates against the whole
schema (jsonschema, formats checked). Values that do constrain and cannot be enforced are still
refused with a SchemaError naming their JSON pointer. Formats: the ones JSON Schema defines are
enforced (or refused: regex), any other is an annotation."""

import ipaddress
import json
import random
import re

import jsonschema
import pytest

from bubo._grammar import Grammar, Matcher
from bubo.chat.schema import FORMATS, REFUSED_FORMATS, SchemaError, schema_to_gbnf

CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
D4, D7, D2020 = jsonschema.Draft4Validator, jsonschema.Draft7Validator, jsonschema.Draft202012Validator


def accepts(grammar, text):
    m = Matcher(grammar)
    return m.accept_bytes(text.encode()) and m.accepting


def walks(grammar, alphabet, n, seed=1234, steps=120):
    """Sentences reached by random walks through grammar (each step a random character it allows)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        m, text = Matcher(grammar), ""
        for _ in range(steps):
            if m.accepting and text and rng.random() < 0.1:
                break
            for ch in rng.sample(alphabet, len(alphabet)):
                m2 = m.clone()
                if m2.accept_bytes(ch.encode()):
                    m, text = m2, text + ch
                    break
            else:
                break
        if m.accepting and text:
            out.append(text)
    return out


JSON_ALPHABET = list('{}[],:" \n0123456789-.eEabcxyzAZ@T_#/\\') + ["true", "false", "null"]

CLOSED = {"properties": {"a": {"type": "integer"}}, "additionalProperties": False}
OBJ = {"type": "object", "properties": {"a": {"type": "integer"}}}

# (schema with keyword values that constrain nothing, the same schema without them, texts its
# grammar accepts, the validator class of the schema's draft)
NOOPS = [
    # arrays
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": False},
     {"type": "array", "items": {"type": "integer"}}, ["[1,1]", "[]"], D2020),
    ({"type": "array", "maxItems": 1, "uniqueItems": True}, {"type": "array", "maxItems": 1}, ["[]", "[3]"], D2020),
    ({"type": "array", "minItems": 0}, {"type": "array"}, ["[]"], D2020),
    ({"minItems": 0}, {}, ["1", "[]"], D2020),  # a keyword of no effect implies no type either
    ({"type": "array", "items": True, "prefixItems": []}, {"type": "array"}, ["[1,\"x\"]"], D2020),
    ({"type": "array", "items": {}}, {"type": "array"}, ["[null]"], D2020),
    ({"type": "array", "items": {"type": "integer"}, "additionalItems": False},  # ignored beside a schema
     {"type": "array", "items": {"type": "integer"}}, ["[1,2]"], D7),
    ({"type": "array", "items": [{"type": "integer"}], "additionalItems": {}},
     {"type": "array", "items": [{"type": "integer"}]}, ["[1]", '[1,"x"]'], D7),
    ({"type": "array", "items": {"type": "integer"}, "unevaluatedItems": False},  # items evaluates all
     {"type": "array", "items": {"type": "integer"}}, ["[1,2]"], D2020),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": True},
     {"type": "array", "prefixItems": [{"type": "integer"}]}, ["[1]", "[1,true]"], D2020),
    ({"type": "array", "minContains": 2, "maxContains": 3}, {"type": "array"}, ["[]"], D2020),  # no contains
    ({"type": "array", "contains": {"type": "integer"}, "minContains": 0}, {"type": "array"}, ["[]", '["x"]'], D2020),
    # objects
    ({**OBJ, "additionalProperties": True}, OBJ, ['{"a":1}', "{}"], D2020),
    ({**OBJ, "additionalProperties": {}}, OBJ, ['{"a":1}'], D2020),
    ({"type": "object", "additionalProperties": {"description": "anything"}}, {"type": "object"}, ['{"x":[1]}'], D2020),
    ({**OBJ, "required": []}, OBJ, ["{}"], D2020),
    ({"type": "object", "properties": {}}, {"type": "object"}, ["{}", '{"b":2}'], D2020),
    ({"type": "object", "minProperties": 0}, {"type": "object"}, ["{}"], D2020),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"], "minProperties": 2},
     {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"]}, ['{"a":1,"b":2}'], D2020),
    ({"type": "object", **CLOSED, "maxProperties": 1}, {"type": "object", **CLOSED}, ['{"a":1}', "{}"], D2020),
    ({"type": "object", **CLOSED, "unevaluatedProperties": False}, {"type": "object", **CLOSED}, ['{"a":1}'], D2020),
    ({**OBJ, "additionalProperties": True, "unevaluatedProperties": False},  # additionalProperties evaluates all
     OBJ, ['{"a":1}'], D2020),
    ({**OBJ, "unevaluatedProperties": {}}, OBJ, ['{"a":1}'], D2020),
    ({"type": "object", "propertyNames": True}, {"type": "object"}, ['{"k":1}'], D2020),
    ({"type": "object", "propertyNames": {}}, {"type": "object"}, ['{"k":1}'], D2020),
    ({"type": "object", "propertyNames": {"type": "string", "minLength": 0}}, {"type": "object"}, ['{"":1}'], D2020),
    ({"type": "object", "propertyNames": {"maxItems": 1, "minimum": 3}}, {"type": "object"}, ['{"k":1}'], D2020),
    ({"type": "object", "patternProperties": {}}, {"type": "object"}, ['{"k":1}'], D2020),
    ({**OBJ, "additionalProperties": False, "patternProperties": {"^x-": {}}},  # only exempts names
     {**OBJ, "additionalProperties": False}, ['{"a":1}'], D2020),
    ({"type": "object", "dependentRequired": {}}, {"type": "object"}, ["{}"], D2020),
    ({**OBJ, "dependentRequired": {"a": []}}, OBJ, ['{"a":1}'], D2020),
    ({**OBJ, "required": ["a"], "dependentRequired": {"b": ["a"], "a": ["a"]}},
     {**OBJ, "required": ["a"]}, ['{"a":1}'], D2020),
    ({"type": "object", **CLOSED, "dependentRequired": {"z": ["q"]}}, {"type": "object", **CLOSED}, ['{"a":1}'], D2020),
    ({"type": "object", "dependentSchemas": {"a": True, "b": {}}}, {"type": "object"}, ['{"a":1}'], D2020),
    ({"type": "object", **CLOSED, "dependentSchemas": {"z": {"required": ["q"]}}},
     {"type": "object", **CLOSED}, ['{"a":1}'], D2020),
    ({"type": "object", "properties": {"a": {}, "b": False}, "dependentSchemas": {"b": {"required": ["q"]}}},
     {"type": "object", "properties": {"a": {}, "b": False}}, ['{"a":1}'], D2020),
    ({**OBJ, "required": ["a"], "dependencies": {"b": ["a"], "c": {}}}, {**OBJ, "required": ["a"]}, ['{"a":1}'], D7),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {},
                 "minProperties": 0}, {"required": ["a"], "uniqueItems": False}, True, {}]},
     {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]},
     ['{"a":1}'], D2020),
    # strings
    ({"type": "string", "minLength": 0}, {"type": "string"}, ['""'], D2020),
    ({"type": "string", "format": "date", "minLength": 0}, {"type": "string", "format": "date"},
     ['"2024-02-29"'], D2020),
    ({"type": "string", "pattern": ""}, {"type": "string"}, ['"x"'], D2020),
    ({"type": "string", "format": "uuid", "pattern": ""}, {"type": "string", "format": "uuid"},
     ['"123e4567-e89b-12d3-a456-426614174000"'], D2020),
    # numbers
    ({"type": "integer", "multipleOf": 1}, {"type": "integer"}, ["-7", "0"], D2020),
    ({"type": "integer", "minimum": 0, "multipleOf": 0.5}, {"type": "integer", "minimum": 0}, ["3"], D2020),
    ({"type": "integer", "minimum": 2, "exclusiveMinimum": False, "exclusiveMaximum": False},
     {"type": "integer", "minimum": 2}, ["2", "30"], D4),
    # applicators
    ({"type": "string", "not": False}, {"type": "string"}, ['"x"'], D2020),
    ({"type": "string", "not": {"type": "integer", "minimum": 3}}, {"type": "string"}, ['"x"'], D2020),
    ({"type": ["integer", "null"], "not": {"enum": ["a", True]}}, {"type": ["integer", "null"]}, ["1", "null"], D2020),
    ({"type": "string", "if": {"maxLength": 3}, "then": True, "else": {}}, {"type": "string"}, ['"abcdef"'], D2020),
    ({"type": "string", "if": False, "then": {"maxLength": 1}}, {"type": "string"}, ['"abc"'], D2020),
    ({"type": "string", "if": True, "else": {"maxLength": 1}}, {"type": "string"}, ['"abc"'], D2020),
    ({"type": "string", "if": {"maxLength": 1}}, {"type": "string"}, ['"abc"'], D2020),
    ({"type": "string", "then": {"maxLength": 1}, "else": False}, {"type": "string"}, ['"abc"'], D2020),
    ({**OBJ, "anyOf": [True, {"required": ["a"]}]}, OBJ, ["{}"], D2020),
    ({**OBJ, "anyOf": [{"required": ["a"]}, {"not": False}]}, OBJ, ["{}"], D2020),
    ({"type": "string", "allOf": [True, {}, {"description": "d"}]}, {"type": "string"}, ['"x"'], D2020),
    ({"type": "string", "oneOf": [False, True]}, {"type": "string"}, ['"x"'], D2020),
    ({"anyOf": [False, {"type": "string"}]}, {"type": "string"}, ['"x"'], D2020),
    ({"oneOf": [False, {"type": "integer"}, {"type": "string"}]}, {"oneOf": [{"type": "integer"}, {"type": "string"}]},
     ["1", '"x"'], D2020),
    ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "not": False, "minLength": 0},
     {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}, ["5"], D2020),
    # keywords of another type than the schema's
    ({"type": "string", "uniqueItems": True, "minProperties": 3, "multipleOf": 7, "contains": {},
      "dependentRequired": {"a": ["b"]}, "unevaluatedProperties": False, "minimum": 4},
     {"type": "string"}, ['"x"'], D2020),
    ({"type": ["integer", "boolean"], "uniqueItems": True, "patternProperties": {"^x": {"type": "string"}}},
     {"type": ["integer", "boolean"]}, ["1", "true"], D2020),
    # annotations
    ({"type": "string", "contentSchema": {"type": "object"}, "contentMediaType": "application/json",
      "$dynamicAnchor": "s", "$vocabulary": {}}, {"type": "string"}, ['"{}"'], D2020),
    # nested
    ({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "minLength": 0},
                                                "uniqueItems": False, "minItems": 0}}, "required": ["tags"],
      "additionalProperties": False, "minProperties": 1},
     {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}, "required": ["tags"],
      "additionalProperties": False}, ['{"tags":["a","a"]}'], D2020),
]


@pytest.mark.parametrize("schema,same_as,good,validator", NOOPS, ids=[json.dumps(c[0])[:70] for c in NOOPS])
def test_a_value_that_constrains_nothing_is_accepted_and_changes_nothing(schema, same_as, good, validator):
    gbnf = schema_to_gbnf(schema)
    assert gbnf == schema_to_gbnf(same_as)
    grammar = Grammar(gbnf)
    check = validator(schema, format_checker=validator.FORMAT_CHECKER)
    for text in good:
        assert accepts(grammar, text), text
        assert check.is_valid(json.loads(text)), f"test case wrong: {text!r}"
    found = walks(grammar, sorted(set(JSON_ALPHABET) | set("".join(good))), 30)
    assert found
    for text in found:
        assert check.is_valid(json.loads(text)), text


@pytest.mark.parametrize("schema,pointer", [
    ({"type": "array", "uniqueItems": True}, "/uniqueItems"),
    ({"type": "array", "uniqueItems": True, "maxItems": 2}, "/uniqueItems"),
    ({"type": "array", "uniqueItems": "no"}, "/uniqueItems"),
    ({"type": ["array", "string"], "uniqueItems": True}, "/uniqueItems"),
    ({"type": "array", "minItems": 1, "uniqueItems": True}, "/uniqueItems"),
    ({"not": {"type": "string"}}, "/not"),
    ({"type": "string", "not": {"type": "string", "maxLength": 2}}, "/not"),
    ({"type": ["string", "integer"], "not": {"type": "integer"}}, "/not"),
    ({"type": "integer", "not": {"type": "number"}}, "/not"),
    ({"not": {}}, "/not"),
    ({"type": "string", "not": True}, "/not"),
    ({"type": "object", "properties": {"a": {"type": "string", "not": {"description": "all"}}}}, "/properties/a/not"),
    ({"type": "object", "required": ["a"], "minProperties": 2}, "/minProperties"),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "maxProperties": 1}, "/maxProperties"),
    ({"type": "object", **CLOSED, "patternProperties": {"^x": {}}, "maxProperties": 1}, "/maxProperties"),
    ({"type": "array", "contains": {"type": "integer"}}, "/contains"),
    ({"type": "array", "contains": {"type": "integer"}, "minContains": 0, "maxContains": 1}, "/contains"),
    ({"type": "array", "contains": True}, "/contains"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "/dependentRequired"),
    ({"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}}, "/dependentSchemas"),
    ({"type": "object", "dependencies": {"a": ["b"]}}, "/dependencies"),
    ({"type": "object", "propertyNames": {"maxLength": 3}}, "/propertyNames"),
    ({"type": "object", "propertyNames": {"type": "integer"}}, "/propertyNames"),
    ({"type": "object", "propertyNames": False}, "/propertyNames"),
    ({"type": "object", "unevaluatedProperties": False}, "/unevaluatedProperties"),
    ({"type": "array", "prefixItems": [{}], "unevaluatedItems": False}, "/unevaluatedItems"),
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, "/patternProperties"),
    ({"type": "object", "patternProperties": {"(": {}}}, "/patternProperties"),
    ({"type": "string", "if": {"maxLength": 3}, "then": {"pattern": "a"}}, "/if"),
    ({"type": "string", "if": True, "then": {"maxLength": 1}}, "/if"),
    ({"type": "string", "if": {"maxLength": 3}, "else": {"maxLength": 5}}, "/if"),
    ({"type": "integer", "multipleOf": 5}, "/multipleOf"),
    ({"type": "number", "multipleOf": 0.1}, "/multipleOf"),
    ({"type": "number", "multipleOf": 3}, "/multipleOf"),
    ({"type": "integer", "multipleOf": 0}, "/multipleOf"),
    ({"type": "integer", "multipleOf": -1}, "/multipleOf"),
    ({"type": "integer", "multipleOf": True}, "/multipleOf"),
    ({"type": "integer", "exclusiveMinimum": True}, "/exclusiveMinimum"),
    ({"type": "string", "format": "regex"}, "/format"),
    ({"type": "string", "format": "color"}, "/format"),
    ({"type": "string", "format": 3}, "/format"),
    ({"type": "string", "minLength": -1}, "/minLength"),
    ({"oneOf": [False, False]}, "/oneOf"),
    ({"anyOf": [False]}, "/anyOf"),
    ({"allOf": [True, False]}, "/allOf/1"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}},
     "/properties/a/uniqueItems"),
])
def test_a_value_that_constrains_is_still_refused(schema, pointer):
    with pytest.raises(SchemaError) as e:
        schema_to_gbnf(schema)
    assert e.value.pointer == pointer
    assert str(e.value).startswith(pointer)


def test_multiple_of_a_divisor_of_one_makes_numbers_integers():
    for m in (1, 1.0, 0.5, 0.25):
        schema = {"type": "number", "multipleOf": m, "minimum": -2.5, "maximum": 7.5}
        g = Grammar(schema_to_gbnf(schema))
        for text in ("-2", "0", "7"):
            assert accepts(g, text) and D2020(schema).is_valid(json.loads(text)), (m, text)
        for text in ("7.5", "-3", "8", "1.0", "1e0"):
            assert not accepts(g, text), (m, text)
    assert schema_to_gbnf({"type": "number", "multipleOf": 1}) == schema_to_gbnf({"type": "integer"})
    assert schema_to_gbnf({"multipleOf": 1}) == schema_to_gbnf({"type": "integer"})


def test_one_of_branches_are_apart_by_what_they_admit_not_what_they_generate():
    # {"minLength": 1} generates strings but admits 5, which the second branch admits too
    for schema in ({"oneOf": [{"minLength": 1}, {"type": "integer"}]},
                   {"oneOf": [{"properties": {"k": {"const": "a"}}, "required": ["k"]}, {"type": "null"}]}):
        with pytest.raises(SchemaError) as e:
            schema_to_gbnf(schema)
        assert e.value.pointer == "/oneOf"
    schema = {"oneOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]}
    g = Grammar(schema_to_gbnf(schema))
    assert accepts(g, '"x"') and accepts(g, "5") and D2020(schema).is_valid(5)


def test_an_anchor_reference_is_refused_not_taken_for_the_root():
    schema = {"$defs": {"a": {"$anchor": "foo", "type": "string"}}, "type": "object",
              "properties": {"x": {"$ref": "#foo"}}}
    with pytest.raises(SchemaError) as e:
        schema_to_gbnf(schema)
    assert e.value.pointer == "/properties/x/$ref"


# --- formats --------------------------------------------------------------------------------

# the format checks that jsonschema has only with its optional packages, from the regular
# expressions of ajv-formats and RFC 3986; jsonschema's own check runs too where it has one
_UNRES = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})"
_PCHAR = rf"(?:{_UNRES}|[:@])"
_AUTH = rf"(?:(?:{_UNRES}|:)*@)?(?:\[[0-9A-Fa-f:.]+\]|{_UNRES}*)(?::[0-9]*)?"
_PATH = rf"(?:/{_PCHAR}*)*"
_TAIL = rf"(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
_ROOTED = rf"//{_AUTH}{_PATH}|/(?:{_PCHAR}+{_PATH})?"
_URI = rf"[A-Za-z][A-Za-z0-9+.\-]*:(?:{_ROOTED}|{_PCHAR}+{_PATH})?{_TAIL}"
_URI_REF = rf"{_URI}|(?:{_ROOTED}|(?:{_UNRES}|@)+{_PATH})?{_TAIL}"
_HOSTNAME = (r"(?=.{1,253}\.?$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
             r"(?:\.[a-z0-9](?:[-0-9a-z]{0,61}[0-9a-z])?)*\.?")
_DURATION = r"P(?!$)((\d+Y)?(\d+M)?(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+S)?)?|(\d+W)?)"
_URI_TEMPLATE = (r"(?:(?:[^\x00-\x20\"'<>%\\^`{|}]|%[0-9a-f]{2})|\{[+#./;?&=,!@|]?(?:[a-z0-9_]|%[0-9a-f]{2})+"
                 r"(?::[1-9][0-9]{0,3}|\*)?(?:,(?:[a-z0-9_]|%[0-9a-f]{2})+(?::[1-9][0-9]{0,3}|\*)?)*\})*")


def _ip(kind):
    def check(text):
        try:
            kind(text)
        except ValueError:
            return False
        return "%" not in text

    return check


ORACLES = {
    "hostname": lambda t: re.fullmatch(_HOSTNAME, t, re.I) is not None,
    "duration": lambda t: re.fullmatch(_DURATION, t) is not None,
    "uri": lambda t: re.fullmatch(_URI, t) is not None,
    "uri-reference": lambda t: re.fullmatch(_URI_REF, t) is not None,
    "uri-template": lambda t: re.fullmatch(_URI_TEMPLATE, t, re.I) is not None,
    "ipv4": _ip(ipaddress.IPv4Address),
    "ipv6": _ip(ipaddress.IPv6Address),
}
ALIASES = {"iri": "uri", "iri-reference": "uri-reference", "idn-hostname": "hostname", "host-name": "hostname",
           "ip-address": "ipv4", "idn-email": "email"}


def format_ok(fmt, text):
    for name in {fmt, ALIASES.get(fmt, fmt)}:
        if name in ORACLES and not ORACLES[name](text):
            return False
        if name in CHECKER.checkers and not CHECKER.conforms(text, name):
            return False
    return True


EXAMPLES = {  # format: (values its grammar accepts, invalid values it refuses)
    "hostname": (["example.com", "localhost", "a-b.c-d.example", "Mail.Example.COM", "x1-y2-z3.org"],
                 ["-a.com", "a-.com", "a..b", "", "a_b.com"]),
    "ipv4": (["192.168.0.1", "0.0.0.0", "255.255.255.255"], ["256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5"]),
    "ipv6": (["::1", "::", "2001:db8::8a2e:370:7334", "fe80::1", "::ffff:192.0.2.1", "1:2:3:4:5:6:7:8",
              "1:2:3:4:5:6:7::", "1::", "ABCD:ef01::1.2.3.4"],
             ["1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", ":1", "1:2:3:4:5:6:7:8::", "::1.2.3", "g::"]),
    "duration": (["P3D", "PT4H", "P1Y2M3DT4H5M6S", "P2W", "PT0S", "P1M", "PT1M30S"],
                 ["P", "PT", "P1H", "3D", "P1DT", "P1.5D"]),
    "uri": (["https://example.com", "http://user@host:8080/a/b?q=1&r=%20#f", "mailto:a@example.com",
             "urn:isbn:0451450523", "http://[1:2:3:4:5:6:7:8]/x", "file:///etc/hosts", "a:"],
            ["example.com", "/a/b", "http://h/a b", "http://h/%zz", "1http://x", ""]),
    "uri-reference": (["/a/b?c", "../x", "//host/p", "", "https://example.com/", "#frag", "?q"],
                      ["a b", "%zz", "a:b c", "http://h/\\"]),
    "uri-template": (["http://example.com/{id}", "/users{?page,limit}", "{+path}/x", "{var:3}", "{list*}", "plain"],
                     ["{", "{}", "a{b", "{a b}", "a}"]),
    "json-pointer": (["", "/a", "/a~1b/0", "/é", "/"], ["a", "/~2", "/~"]),
    "relative-json-pointer": (["0", "1/a", "2#", "10", "0/x~0"], ["-1", "/a", "01", "", "1~"]),
    "email": (["a.b@example.com", "x+y@mail.co.uk"], ["ab", "a.example.com"]),
}
EXAMPLES.update({alias: EXAMPLES[target] for alias, target in ALIASES.items()})
FORMAT_ALPHABET = [chr(c) for c in range(0x20, 0x7F)] + ["é", "\n"]


def test_every_format_json_schema_defines_is_enforced_or_refused():
    defined = {"date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4",
               "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
               "relative-json-pointer", "regex"}
    assert defined <= set(FORMATS) | REFUSED_FORMATS
    assert not set(FORMATS) & REFUSED_FORMATS


@pytest.mark.parametrize("fmt", sorted(EXAMPLES))
def test_formats_accept_their_values_and_refuse_others(fmt):
    g = Grammar(schema_to_gbnf({"type": "string", "format": fmt}))
    good, bad = EXAMPLES[fmt]
    for value in good:
        assert format_ok(fmt, value), f"test case wrong: {value!r}"
        assert accepts(g, json.dumps(value, ensure_ascii=False)), value
    for value in bad:
        assert not format_ok(fmt, value), f"test case wrong: {value!r}"
        assert not accepts(g, json.dumps(value, ensure_ascii=False)), value


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_random_sentences_of_each_format_validate(fmt):
    schema = {"type": "string", "format": fmt}
    grammar = Grammar(schema_to_gbnf(schema))
    check = D2020(schema, format_checker=CHECKER)
    found = walks(grammar, FORMAT_ALPHABET, 60, steps=160)
    assert len(found) > 10
    for text in found:
        value = json.loads(text)
        assert check.is_valid(value) and format_ok(fmt, value), text


@pytest.mark.parametrize("fmt", ["password", "binary", "int32", "byte", "Date-Time", "my-format"])
def test_a_format_json_schema_does_not_define_is_an_annotation(fmt):
    assert schema_to_gbnf({"type": "string", "format": fmt}) == schema_to_gbnf({"type": "string"})
    assert schema_to_gbnf({"type": "string", "format": fmt, "maxLength": 3}) == \
        schema_to_gbnf({"type": "string", "maxLength": 3})
    assert schema_to_gbnf({"type": "integer", "format": fmt}) == schema_to_gbnf({"type": "integer"})
