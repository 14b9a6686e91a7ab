"""The grammar of an answer's reasoning (bubo.chat.thinking): which texts each case of the table
accepts, around no constraint, a JSON grammar and a forced call."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubo._grammar import Grammar, Matcher
from bubo.chat.thinking import answer_grammar, free_text, template_thinks
from bubo.chat.tools import call_grammar

JSON = 'root ::= "{" digits "}"\ndigits ::= [0-9]{1,3}\n'
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
CALL = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'


def accepts(gbnf: str, text: str, root: str = "root") -> bool:
    m = Matcher(Grammar(gbnf, root=root))
    return m.accept_bytes(text.encode()) and m.accepting


def test_template_thinks():
    assert template_thinks("{{ '<think>\\n' }}") and not template_thinks("<|im_start|>") and not template_thinks(None)


@pytest.mark.parametrize("thinks", [False, True])
def test_thinking_on_without_a_constraint_needs_no_grammar(thinks):
    assert answer_grammar(None, thinking=True, in_think=False, thinks=thinks) is None
    assert answer_grammar(None, thinking=True, in_think=True, thinks=thinks) is None


def test_a_template_that_does_not_think_keeps_the_constraint_as_it_is():
    assert answer_grammar(JSON, thinking=True, in_think=False, thinks=False) is None
    assert answer_grammar(JSON, thinking=False, in_think=False, thinks=False) is None
    assert answer_grammar(None, thinking=False, in_think=False, thinks=False) is None


def test_on_and_the_prompt_opened_the_block_reasoning_then_the_constraint():
    g = answer_grammar(JSON, thinking=True, in_think=True, thinks=False)
    assert accepts(g, "2 and 3 make {5}? </thi no\n</think>\n\n{5}")
    assert accepts(g, "</think>{5}")
    assert not accepts(g, "{5}")  # the block is closed first
    assert not accepts(g, "a</think>b</think>{5}")  # once
    assert not accepts(g, "a</think>{x}")  # and the constraint holds after it


def test_on_and_the_model_may_open_the_block_before_the_constraint():
    g = answer_grammar(JSON, thinking=True, in_think=False, thinks=True)
    assert accepts(g, "{5}") and accepts(g, "<think>sum</think>\n{5}")
    assert not accepts(g, "sum</think>{5}") and not accepts(g, "<think>sum{5}")


@pytest.mark.parametrize("body", [None, JSON])
def test_off_and_the_prompt_opened_the_block_it_closes_at_once(body):
    g = answer_grammar(body, thinking=False, in_think=True, thinks=False)
    after = "{5}" if body else "The sum is 5."
    assert accepts(g, "</think>" + after) and accepts(g, "</think>\n\n" + after)
    assert not accepts(g, after)
    assert not accepts(g, "let me see</think>" + after)  # no reasoning


@pytest.mark.parametrize("body", [None, JSON])
def test_off_and_the_model_opens_a_block_it_is_empty(body):
    g = answer_grammar(body, thinking=False, in_think=False, thinks=True)
    after = "{5}" if body else "The sum is 5."
    assert accepts(g, after) and accepts(g, "<think></think>" + after) and accepts(g, "<think></think>\n\n" + after)
    assert not accepts(g, "<think>let me see</think>" + after)
    assert not accepts(g, "<think>\n</think>" + after)


def test_off_the_free_answer_never_starts_a_block():
    g = answer_grammar(None, thinking=False, in_think=False, thinks=True)
    for ok in ["", "Hi", "  \n<b>bold</b>", "<thinking is fun", "<thin", "a <think> tag in a sentence",
               "<think></think>"]:
        assert accepts(g, ok), ok
    for bad in ["<think>", "<think>x", " \n\t<think>", "<think></think><think>x"]:
        assert not accepts(g, bad), bad


@given(st.text(alphabet="<think/> \nab", max_size=16))
@settings(max_examples=300, deadline=None)
def test_free_text_is_exactly_the_texts_not_led_by_the_tag(text):
    g = "root ::= free\n" + "\n".join(free_text("free")) + "\n"
    assert accepts(g, text) == (not text.lstrip(" \t\n\r").startswith("<think>"))


@pytest.mark.parametrize("thinking", [False, True])
def test_a_forced_call_after_the_block_the_prompt_opened(thinking):
    g = answer_grammar(call_grammar("hermes", TOOLS, parallel=False), thinking=thinking, in_think=True, thinks=False)
    assert accepts(g, f"</think>\n\n{CALL}")
    assert accepts(g, f"the tool f</think>\n\n{CALL}") == thinking
    assert not accepts(g, CALL) and not accepts(g, "</think>\n\nno call")
