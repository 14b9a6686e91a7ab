"""JSON Schema to GBNF (bubo.chat.schema): for every supported keyword, instances the schema
accepts are accepted by the grammar and instances it rejects are rejected; everything the
grammar accepts is checked against the `jsonschema` validator too. Unsupported keywords raise
SchemaError naming their JSON pointer."""

import json

import jsonschema
import pytest

from bubo._grammar import Grammar, Matcher
from bubo.chat.schema import JSON_OBJECT_GBNF, SchemaError, schema_to_gbnf

FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


def accepts(grammar, text):
    m = Matcher(grammar)
    return m.accept_bytes(text.encode()) and m.accepting


def validates(schema, text):
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return jsonschema.Draft202012Validator(schema, format_checker=FORMATS).is_valid(value)


OBJ = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                        "tag": {"type": "string"}}, "required": ["name"],
       "additionalProperties": False}
DEFS = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                              "kids": {"type": "array",
                                                                       "items": {"$ref": "#/$defs/node"}}},
                           "required": ["v", "kids"]}},
        "$ref": "#/$defs/node"}

CASES = [
    # (schema, texts the grammar must accept, texts it must reject)
    ({"type": "string"}, ['""', '"a b"', '"\\"q\\" \\\\ \\n \\u00e9"', '"日本"'], ['"a', "1", '"\x01"', '"\\x"']),
    ({"type": "integer"}, ["0", "-7", "123456789012345"], ["01", "1.5", "-", '"1"', "1e3"]),
    ({"type": "number"}, ["0", "-1.25", "3e10", "2.5E-3"], ["1.", ".5", "+1", "0x10"]),
    ({"type": "boolean"}, ["true", "false"], ["True", "1"]),
    ({"type": "null"}, ["null"], ["nil", ""]),
    ({"type": ["string", "null"], "maxLength": 2}, ['"ab"', "null"], ['"abc"', "1"]),
    ({"type": "integer", "nullable": True}, ["3"], ['"3"', "null"]),  # OpenAPI's nullable is no JSON Schema
    (OBJ, ['{"name": "a"}', '{"name":"a","age":3}', '{"name":"a","tag":"t"}', '{"name":"a","age":1,"tag":"t"}',
           '{\n  "name": "a",\n  "age": 1\n}'],
     ['{}', '{"age":3}', '{"age":3,"name":"a"}', '{"name":"a","x":1}', '{"name":"a",}', '{"name":"a" "age":1}',
      '{"name": "a"' + " " * 30 + "}"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, ['{"a":1}', "{}"], ['{"b":1}', '{"a":"x"}']),
    ({"type": "object"}, ['{}', '{"x": [1, {"y": null}]}'], ["[]", "1"]),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, ['{"a":1,"b":2}', "{}"], ['{"a":"x"}']),
    ({"type": "object", "additionalProperties": False}, ["{}"], ['{"a":1}']),
    ({"enum": ["red", "green", 3, None]}, ['"red"', "3", "null"], ['"blue"', "4"]),
    ({"type": "string", "enum": ["a", 1]}, ['"a"'], ["1"]),
    ({"const": {"k": [1, "x"]}}, ['{"k":[1,"x"]}'], ['{"k":[1]}', '{"k": [1,"x"]}']),
    ({"type": "array", "items": {"type": "integer"}}, ["[]", "[1, 2,3]"], ['[1,"a"]', "[1,]"]),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}, ["[1,2]", "[1,2,3]"],
     ["[1]", "[1,2,3,4]", "[]"]),
    ({"type": "array", "maxItems": 1}, ["[]", '["x"]'], ["[1,2]"]),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
     ['["a",1]'], ['["a"]x', '["a",1,2]', '[1,"a"]']),
    ({"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "boolean"}, "maxItems": 3},
     ['["a"]', '["a",true,false]'], ['["a",true,false,true]', '["a",1]']),
    ({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]}, ['"x"', "5"], ["-1", "null"]),
    ({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                 "required": ["kind", "x"], "additionalProperties": False},
                {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}},
                 "required": ["kind", "y"], "additionalProperties": False}]},
     ['{"kind":"a","x":1}', '{"kind":"b","y":"s"}'], ['{"kind":"a","y":"s"}', '{"kind":"c","x":1}']),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     ['{"a":1,"b":"x"}'], ['{"a":1}', '{"b":"x"}']),
    (DEFS, ['{"v":1,"kids":[]}', '{"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]}]}'],
     ['{"v":1}', '{"v":1,"kids":[{"v":2}]}']),
    ({"definitions": {"p": {"type": "string", "maxLength": 1}}, "type": "array", "items": {"$ref": "#/definitions/p"}},
     ['["a","b"]'], ['["ab"]']),
    ({"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["next"],
      "additionalProperties": False}, ['{"next":null}', '{"next":{"next":null}}'], ['{"next":{}}']),
    ({"type": "string", "minLength": 2, "maxLength": 3}, ['"ab"', '"abc"', '"\\n\\t"', '"日本語"'],
     ['"a"', '"abcd"', '"\\ud83d\\ude00"']),
    ({"type": "string", "format": "date"}, ['"2024-02-29"', '"2023-12-31"', '"2000-02-29"'],
     ['"2023-02-29"', '"1900-02-29"', '"2023-04-31"', '"2023-13-01"', '"2023-1-01"']),
    ({"type": "string", "format": "time"}, ['"12:30:00Z"', '"23:59:59.123+02:00"'], ['"24:00:00Z"', '"12:30:00"']),
    ({"type": "string", "format": "date-time"}, ['"2024-01-15T08:00:00Z"'], ['"2024-01-15 08:00:00Z"']),
    ({"type": "string", "format": "uuid"}, ['"123e4567-e89b-12d3-a456-426614174000"'], ['"123e4567e89b12d3"']),
    ({"type": "string", "format": "email"}, ['"a.b@example.com"', '"x+y@mail.co.uk"'], ['"a@b"', '"@x.com"']),
    ({"type": "integer", "minimum": -15, "maximum": 250}, ["-15", "-1", "0", "9", "99", "199", "250"],
     ["-16", "251", "300", "1000", "-100"]),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}, ["1", "9"], ["0", "10", "-1"]),
    ({"type": "integer", "minimum": 1.5}, ["2", "1000"], ["1", "0", "-3"]),
    ({"type": "integer", "maximum": -3}, ["-3", "-40"], ["-2", "0", "5"]),
    ({"type": "integer", "minimum": 5, "exclusiveMinimum": True}, ["6"], ["5"]),
    ({"type": "number", "minimum": 0, "maximum": 1}, ["0", "0.5", "1", "1.000", "0.999"], ["1.01", "-0.1", "2", "1e0"]),
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 100}, ["0.001", "50", "100"], ["0", "0.0", "-1", "100.5"]),
    ({"type": "number", "minimum": -10, "exclusiveMaximum": -2}, ["-10", "-2.5", "-9.99"], ["-2", "-10.5", "0"]),
    ({"type": "string", "pattern": "^[A-Z]{2}-\\d{3,4}$"}, ['"AB-123"', '"XY-9999"'],
     ['"ab-123"', '"AB-12"', '"AB-12345"']),
    ({"type": "string", "pattern": "^(cat|dog)s?$"}, ['"cat"', '"dogs"'], ['"cow"', '"cats!"']),
    ({"type": "string", "pattern": "ab+"}, ['"ab"', '"xxabbby"'], ['"a"', '"ba"']),
    ({"type": "string", "pattern": "^a.c$"}, ['"abc"', '"a\\"c"', '"a\\\\c"'], ['"a\\nc"', '"ac"']),
    ({"type": "string", "pattern": "^[^a-z]+$"}, ['"ABC"', '"\\""'], ['"aB"']),
    ({"type": "string", "pattern": "^\\w+(\\.\\w+)*@x\\.org$|^admin$"}, ['"a.b@x.org"', '"admin"'], ['"a@y.org"']),
    ({"type": "string", "pattern": "^[\\s\\S]?\\D\\W$"}, ['"a!"', '" a."'], ['"a1!"', '"aa"']),
    ({"description": "anything", "title": "x"}, ["1", '"s"', "[]"], ["", "tru"]),
    ({"enum": ["café", "日本"]}, ['"café"', '"日本"'], ['"cafe"']),
    ({"type": "object", "properties": {"größe": {"type": "integer"}}, "required": ["größe"]}, ['{"größe": 1}'], ["{}"]),
    ({"type": "string", "pattern": "^[^\u00e9]{1,3}$"}, ['"a日😀"', '"\\\\"'], ['"é"', '"abcd"']),
    ({"type": "string", "pattern": "^[\u00e0-\u00ff]+$"}, ['"éà"'], ['"e"']),
]


@pytest.mark.parametrize("schema,good,bad", CASES, ids=[json.dumps(c[0])[:60] for c in CASES])
def test_schema_instances(schema, good, bad):
    grammar = Grammar(schema_to_gbnf(schema))
    for text in good:
        assert validates(schema, text), f"test case wrong: {text!r}"
        assert accepts(grammar, text), text
    for text in bad:
        assert not accepts(grammar, text), text


def _sentences(grammar, alphabet, max_len):
    """Every string over alphabet (length <= max_len) that grammar accepts, by breadth-first
    walk over prefixes that the grammar still allows."""
    out, frontier = [], [(Matcher(grammar), "")]
    for _ in range(max_len):
        nxt = []
        for m, text in frontier:
            for ch in alphabet:
                m2 = m.clone()
                if m2.accept_bytes(ch.encode()):
                    nxt.append((m2, text + ch))
                    if m2.accepting:
                        out.append(text + ch)
        frontier = nxt
    return out


@pytest.mark.parametrize("schema,alphabet,max_len", [
    ({"type": "integer", "minimum": -12, "maximum": 123}, "-0123456789", 4),
    ({"type": "integer", "exclusiveMinimum": 99, "maximum": 1001}, "0123456789", 4),
    ({"type": "number", "exclusiveMinimum": -2, "maximum": 1}, "-012.5", 5),
    ({"type": "array", "items": {"enum": [1, 2]}, "minItems": 1, "maxItems": 3}, "[]12,", 7),
    ({"type": "string", "pattern": "^(a|bc)*d?$"}, 'abcd"', 7),
])
def test_every_sentence_validates(schema, alphabet, max_len):
    """Exhaustive over a small alphabet: nothing the grammar accepts is invalid, and for the
    bounded ones, every valid string is accepted."""
    grammar = Grammar(schema_to_gbnf(schema))
    found = _sentences(grammar, alphabet, max_len)
    assert found
    for text in found:
        assert validates(schema, text), text
    if schema.get("type") == "integer":
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -10**9) + 1)
        expect = {str(v) for v in range(lo, schema["maximum"] + 1) if len(str(v)) <= max_len}
        assert set(found) == expect


def test_json_object_is_any_object():
    g = Grammar(JSON_OBJECT_GBNF)
    assert accepts(g, '{"a": {"b": [1, "x", null, true]}}')
    assert not accepts(g, "[1]") and not accepts(g, '"x"')


def test_whitespace_is_bounded():
    g = Grammar(schema_to_gbnf(OBJ))
    assert accepts(g, '{"name":' + "\n" + " " * 20 + '"a"}')
    assert not accepts(g, '{"name":' + "\n" + " " * 21 + '"a"}')
    assert not accepts(g, '{"name":\n\n"a"}')
    assert not accepts(g, ' {"name":"a"}')


@pytest.mark.parametrize("schema,pointer", [
    ({"type": "object", "properties": {"age": {"type": "integer", "multipleOf": 5}}}, "/properties/age/multipleOf"),
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, "/patternProperties"),
    ({"if": {"type": "string"}, "then": {"maxLength": 3}}, "/if"),
    ({"type": "array", "uniqueItems": True}, "/uniqueItems"),
    ({"not": {"type": "null"}}, "/not"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "/dependentRequired"),
    ({"type": "object", "minProperties": 1}, "/minProperties"),
    ({"type": "array", "contains": {"type": "integer"}}, "/contains"),
    ({"type": "object", "properties": {"n": {"type": "number", "maximum": 0.5}}}, "/properties/n/maximum"),
    ({"type": "string", "format": "regex"}, "/format"),
    ({"type": "string", "pattern": "^(?=a)b$"}, "/pattern"),
    ({"type": "string", "pattern": "^a\\1$"}, "/pattern"),
    ({"type": "string", "pattern": "a^b"}, "/pattern"),
    ({"$ref": "https://example.com/s.json"}, "/$ref"),
    ({"$ref": "#/$defs/missing"}, "/$ref"),
    ({"type": "strin"}, "/type"),
    ({"items": [{"type": "integer"}], "additionalItems": False, "minItems": 2, "type": "array"}, "/additionalItems"),
    ({"type": "integer", "minimum": 5, "maximum": 3}, "/"),
    ({"oneOf": [{"type": "number"}, {"type": "integer"}]}, "/oneOf"),
    ({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                {"type": "object", "properties": {"b": {"type": "integer"}}}]}, "/oneOf"),
    ({"type": "object", "properties": {"a": {"$defs": {}, "allOf": [{"type": "object", "properties": {"x": {}}},
                                                                    {"type": "string"}]}}},
     "/properties/a/allOf/1/type"),
    ({"type": "object", "properties": {"x": {"type": "string", "unknownKeyword": 1}}}, "/properties/x/unknownKeyword"),
    ({"allOf": [{"$ref": "#"}, {"type": "object"}]}, "/"),
    # integers past a float's range (math.isfinite raises for them): refused, not a crash
    ({"type": "integer", "minimum": 10 ** 309}, "/minimum"),
    ({"type": "integer", "exclusiveMaximum": -(10 ** 400)}, "/exclusiveMaximum"),
    ({"type": "number", "multipleOf": 10 ** 309}, "/multipleOf"),
    # a pattern longer than MAX_PATTERN_CHARS (re.compile's cost is one C call no deadline stops)
    ({"type": "string", "pattern": "[ -\uffff]" * 250}, "/pattern"),
])
def test_unsupported_keywords_name_their_pointer(schema, pointer):
    with pytest.raises(SchemaError) as e:
        schema_to_gbnf(schema)
    assert e.value.pointer == pointer
    assert str(e.value).startswith(pointer)


def test_annotations_are_ignored():
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x", "title": "T",
              "description": "d", "examples": [{}], "type": "object", "$comment": "c", "deprecated": False,
              "properties": {"a": {"type": "integer", "default": 1, "readOnly": True, "x-extra": 1}}}
    assert accepts(Grammar(schema_to_gbnf(schema)), '{"a": 1}')


WALK_ALPHABET = '{}[],:" \n0123456789-+.eEabcdfilnrstuxyzAZ@T_#/\\'


@pytest.mark.parametrize("schema,good,bad", CASES, ids=[json.dumps(c[0])[:60] for c in CASES])
def test_random_sentences_of_the_grammar_validate(schema, good, bad):
    """Random walks through the grammar (each step a random character it allows, over the
    characters of the case's valid texts, or those and JSON's): every sentence reached parses and
    validates, so the grammar admits nothing the schema refuses."""
    import random

    grammar = Grammar(schema_to_gbnf(schema))
    wide = sorted(set(WALK_ALPHABET) | set("".join(good)))
    narrow = sorted(set("".join(good)))  # walks that look like the valid texts get further
    rng = random.Random(1234)
    found = 0
    for walk in range(60):
        alphabet = wide if walk % 2 else narrow
        m, text = Matcher(grammar), ""
        for _ in range(80):
            if m.accepting and (rng.random() < 0.25 or not text):
                if text:
                    break
            for ch in rng.sample(alphabet, len(alphabet)):
                m2 = m.clone()
                if m2.accept_bytes(ch.encode()):
                    m, text = m2, text + ch
                    break
            else:
                break
        if m.accepting and text:
            found += 1
            assert validates(schema, text), text
    assert found > 0
