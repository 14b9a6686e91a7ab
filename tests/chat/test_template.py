"""Chat templates from the real GGUFs' metadata render what transformers would render: the
expected strings are written out by hand from the templates' definitions."""

import pytest

from bubo import GGUFFile, store
from bubo.chat import ChatTemplate, NoChatTemplateError

pytestmark = pytest.mark.models


def _template(name):
    with GGUFFile(store.pull(name)) as f:
        return ChatTemplate.from_metadata(f.metadata, name=name)


CONVO = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Write «ünïcode» & <tags>"},
]


def test_smollm2_chatml_default_system():
    t = _template("smollm2:135m")
    assert t.render(CONVO) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
        "<|im_start|>user\nWrite «ünïcode» & <tags><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_smollm2_chatml_own_system_no_generation_prompt():
    t = _template("smollm2:135m")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert t.render(msgs, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    )


def test_qwen25_default_system():
    t = _template("qwen2.5-coder:0.5b")
    assert t.render(CONVO) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
        "<|im_start|>user\nWrite «ünïcode» & <tags><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_qwen25_tools_and_tool_calls_use_hf_tojson():
    t = _template("qwen2.5-coder:0.5b")
    tools = [{"type": "function", "function": {"name": "weather", "description": "Wetter für <Ort>",
                                                "parameters": {"type": "object",
                                                               "properties": {"city": {"type": "string"}}}}}]
    msgs = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "content": "12°C"},
    ]
    assert t.render(msgs, tools=tools) == (
        "<|im_start|>system\nUse tools.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "weather", "description": "Wetter für <Ort>", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Zürich?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n'
        '{"name": "weather", "arguments": {"city": "Zürich"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n12°C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_gemma3_base_has_no_template():
    with GGUFFile(store.pull("gemma3:270m")) as f:
        with pytest.raises(NoChatTemplateError, match="gemma3:270m has no chat template"):
            ChatTemplate.from_metadata(f.metadata, name="gemma3:270m")
