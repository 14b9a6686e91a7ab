"""The template environment: transformers' helpers, and the sandbox holds."""

import json
import re

import pytest

from bubo.chat import ChatTemplate, ChatTemplateError


def test_helpers_and_special_tokens():
    t = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}"
        "{% endif %}{% generation %}[{{ m.role }}]{{ m.content | tojson }}{% endgeneration %}{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}|{{ strftime_now('%Y') }}",
        bos_token="<s>", eos_token="</s>",
    )
    out = t.render([{"role": "user", "content": "a<b>&'é"}])
    assert re.fullmatch(r"<s>\[user\]\"a<b>&'é\">\</s>\|\d{4}", out)
    with pytest.raises(ChatTemplateError, match="no bad roles"):
        t.render([{"role": "bad", "content": ""}])


def test_tojson_arguments():
    t = ChatTemplate("{{ x | tojson(indent=2) }}|{{ x | tojson(sort_keys=true, separators=(',', ':')) }}")
    x = {"b": 1, "a": [1, "é"]}
    assert t.render([], x=x) == json.dumps(x, indent=2, ensure_ascii=False) + "|" + '{"a":[1,"é"],"b":1}'


def test_trim_and_lstrip_blocks():
    t = ChatTemplate("{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}")
    assert t.render([{"role": "user", "content": "x"}]) == "x\n"


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.append(1) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
])
def test_sandbox_refuses_unsafe_operations(source):
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_bad_templates_and_messages():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError, match="list of dicts"):
        ChatTemplate("x").render("hello")
    with pytest.raises(ChatTemplateError, match="TypeError"):
        ChatTemplate("{{ messages[0].content + 1 }}").render([{"role": "user", "content": "x"}])
