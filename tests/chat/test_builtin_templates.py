"""llama.cpp's built-in chat templates by name (bubo/chat/builtin.py) render exactly what
llama.cpp's own formatter renders for the same name: tests/data/oracle/chat_templates.json holds
llama_chat_apply_template's output for every name it knows, captured by
scripts/chat_template_oracle.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bubo.chat.builtin import BUILTIN, builtin_template
from bubo.chat.template import ChatTemplate

pytestmark = pytest.mark.quick

ORACLE = json.loads((Path(__file__).resolve().parents[1] / "data" / "oracle" / "chat_templates.json").read_text())


def test_every_name_llama_cpp_knows_is_built_in():
    assert sorted(BUILTIN) == sorted(ORACLE["renderings"])


@pytest.mark.parametrize("name", sorted(ORACLE["renderings"]))
def test_the_rendering_equals_llama_cpps(name):
    template = ChatTemplate(builtin_template(name), name=name)
    for conv, expected in zip(ORACLE["conversations"], ORACLE["renderings"][name], strict=True):
        got = template.render(conv["messages"], add_generation_prompt=conv["add_generation_prompt"])
        assert got == expected, (conv["messages"], conv["add_generation_prompt"])


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="no built-in chat template named 'lama3': did you mean llama3?.*chatml"):
        builtin_template("lama3")
