"""llama.cpp's built-in chat templates by name (`--chat-template chatml`), as Jinja templates that
render the same text as llama.cpp's own formatter for each name (llama_chat_apply_template, what
llama-server uses for `--chat-template NAME`); tests/chat/test_builtin_templates.py holds each to
llama.cpp's captured renderings.

    source = builtin_template("llama3")   # the Jinja source; KeyError-free: ValueError naming the known ones

Like llama.cpp's formatter these read only each message's role and content: no tools, no
reasoning markup. A model's own template (or --chat-template-file) is the way to those."""

from __future__ import annotations

import difflib

C = "m.content"
T = "(m.content|trim)"  # llama.cpp's trim: the ASCII white space at both ends


def _lit(text: str) -> str:
    """text as a Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def _each(body: str, prompt: str = "", before: str = "") -> str:
    """A loop over the messages (body: Jinja statements for message m), then the generation prompt."""
    out = before + "{%- for m in messages -%}" + body + "{%- endfor -%}"
    if prompt:
        out += "{%- if add_generation_prompt -%}{{ " + _lit(prompt) + " }}{%- endif -%}"
    return out


def _by_role(cases: dict[str, str], other: str | None = None) -> str:
    """if/elif over m.role; cases role -> a Jinja expression to print; other: for the rest (None: nothing)."""
    out = ""
    for i, (role, expr) in enumerate(cases.items()):
        out += ("{%- if" if i == 0 else "{%- elif") + f" m.role == {_lit(role)} -%}}{{{{ {expr} }}}}"
    if other is not None:
        out += f"{{%- else -%}}{{{{ {other} }}}}"
    return out + "{%- endif -%}"


def _wrap(prefix: str, suffix: str, content: str = C) -> str:
    return f"{_lit(prefix)} + {content} + {_lit(suffix)}"


def _role_line(before: str, between: str, after: str, content: str = C) -> str:
    """before + role + between + content + after, for every message."""
    return f"{{{{ {_lit(before)} + m.role + {_lit(between)} + {content} + {_lit(after)} }}}}"


def _mistral_v1_v3(lead: str, trail: str, trim_answer: bool) -> str:
    answer = T if trim_answer else C
    return ("{%- set ns = namespace(inside=false) -%}" + _each(
        "{%- if not ns.inside -%}{{ " + _lit(lead + "[INST]" + trail) + " }}{%- set ns.inside = true -%}{%- endif -%}"
        "{%- if m.role == 'system' -%}{{ m.content + '\\n\\n' }}"
        "{%- elif m.role == 'user' -%}{{ m.content + " + _lit(lead + "[/INST]") + " }}"
        "{%- else -%}{{ " + _lit(trail) + " + " + answer + " + '</s>' }}{%- set ns.inside = false -%}{%- endif -%}"))


def _llama2(system: bool, bos_inside: bool, strip: bool) -> str:
    content = T if strip else C
    sys_expr = f"'<<SYS>>\\n' + {content} + '\\n<</SYS>>\\n\\n'" if system else f"{content} + '\\n'"
    return ("{{- '[INST] ' -}}{%- set ns = namespace(inside=true) -%}" + _each(
        "{%- if not ns.inside -%}{%- set ns.inside = true -%}{{ " + _lit("<s>[INST] " if bos_inside else "[INST] ")
        + " }}{%- endif -%}"
        "{%- if m.role == 'system' -%}{{ " + sys_expr + " }}"
        "{%- elif m.role == 'user' -%}{{ " + content + " + ' [/INST]' }}"
        "{%- else -%}{{ " + content + " + '</s>' }}{%- set ns.inside = false -%}{%- endif -%}"))


def _merged_system(trim: bool, turn: str, prompt: str) -> str:
    """gemma: the system messages' text goes at the head of the next user turn."""
    sys_text = T if trim else C
    return ("{%- set ns = namespace(system='') -%}" + _each(
        "{%- if m.role == 'system' -%}{%- set ns.system = ns.system + " + sys_text + " -%}"
        "{%- else -%}{%- set role = 'model' if m.role == 'assistant' else m.role -%}"
        "{{ '<start_of_turn>' + role + '\\n' }}"
        "{%- if ns.system and role != 'model' -%}{{ ns.system + '\\n\\n' }}{%- set ns.system = '' -%}{%- endif -%}"
        "{{ " + turn + " }}{%- endif -%}", prompt))


def _bailing(think: bool) -> str:
    return _each("{%- set role = 'HUMAN' if m.role == 'user' else m.role|upper -%}"
                 "{{ '<role>' + role + '</role>' + m.content }}",
                 "<role>ASSISTANT</role>" + ("<think>" if think else ""))


def _granite(v4: bool) -> str:
    if v4:
        head = ("{%- if m.role == 'assistant_tool_call' -%}"
                "{{ '<|start_of_role|>assistant<|end_of_role|><|tool_call|>' }}"
                "{%- else -%}{{ '<|start_of_role|>' + m.role + '<|end_of_role|>' }}{%- endif -%}")
    else:
        head = ("{{ '<|start_of_role|>' + m.role + '<|end_of_role|>' }}"
                "{%- if m.role == 'assistant_tool_call' -%}{{ '<|tool_call|>' }}{%- endif -%}")
    return _each(head + "{{ m.content + '<|end_of_text|>\\n' }}", "<|start_of_role|>assistant<|end_of_role|>")


def _exaone(system: str, user: str, assistant: str, tool: str | None, end: str, prompt: str,
            user_end: str = "\n") -> str:
    cases = {"system": _wrap(system, end, T), "user": _wrap(user, user_end, T),
             "assistant": _wrap(assistant, end, T)}
    if tool is not None:
        cases["tool"] = _wrap(tool, end, T)
    return _each(_by_role(cases), prompt)


BUILTIN: dict[str, str] = {
    "chatml": _each(_role_line("<|im_start|>", "\n", "<|im_end|>\n"), "<|im_start|>assistant\n"),
    "llama2": _llama2(False, False, False),
    "llama2-sys": _llama2(True, False, False),
    "llama2-sys-bos": _llama2(True, True, False),
    "llama2-sys-strip": _llama2(True, False, True),
    "mistral-v1": _mistral_v1_v3(" ", " ", False),
    "mistral-v3": _mistral_v1_v3("", " ", True),
    "mistral-v3-tekken": _mistral_v1_v3("", "", False),
    "mistral-v7": _each(_by_role({"system": _wrap("[SYSTEM_PROMPT] ", "[/SYSTEM_PROMPT]"),
                                  "user": _wrap("[INST] ", "[/INST]")}, _wrap(" ", "</s>"))),
    "mistral-v7-tekken": _each(_by_role({"system": _wrap("[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"),
                                         "user": _wrap("[INST]", "[/INST]")}, _wrap("", "</s>"))),
    "phi3": _each(_role_line("<|", "|>\n", "<|end|>\n"), "<|assistant|>\n"),
    "phi4": _each(_role_line("<|im_start|>", "<|im_sep|>", "<|im_end|>"), "<|im_start|>assistant<|im_sep|>"),
    "falcon3": _each(_role_line("<|", "|>\n", "\n"), "<|assistant|>\n"),
    "zephyr": _each(_role_line("<|", "|>\n", "<|endoftext|>\n"), "<|assistant|>\n"),
    "monarch": _each("{{ ('' if loop.first else '<s>') + m.role + '\\n' + m.content + '</s>\\n' }}", "<s>assistant\n"),
    "gemma": _merged_system(True, f"{T} + '<end_of_turn>\\n'", "<start_of_turn>model\n"),
    "orion": ("{%- set ns = namespace(system='') -%}" + _each(
        "{%- if m.role == 'system' -%}{%- set ns.system = ns.system + m.content -%}"
        "{%- elif m.role == 'user' -%}{{ 'Human: ' }}"
        "{%- if ns.system -%}{{ ns.system + '\\n\\n' }}{%- set ns.system = '' -%}{%- endif -%}"
        "{{ m.content + '\\n\\nAssistant: </s>' }}"
        "{%- else -%}{{ m.content + '</s>' }}{%- endif -%}")),
    "openchat": _each(_by_role({"system": _wrap("", "<|end_of_turn|>")},
                               "'GPT4 Correct ' + (m.role[:1]|upper) + m.role[1:] + ': ' + m.content"
                               " + '<|end_of_turn|>'"),
                      "GPT4 Correct Assistant:"),
    "vicuna": _each(_by_role({"system": _wrap("", "\n\n"), "user": _wrap("USER: ", "\n"),
                              "assistant": _wrap("ASSISTANT: ", "</s>\n")}), "ASSISTANT:"),
    "vicuna-orca": _each(_by_role({"system": _wrap("SYSTEM: ", "\n"), "user": _wrap("USER: ", "\n"),
                                   "assistant": _wrap("ASSISTANT: ", "</s>\n")}), "ASSISTANT:"),
    "deepseek": _each(_by_role({"system": C, "user": _wrap("### Instruction:\n", "\n"),
                                "assistant": _wrap("### Response:\n", "\n<|EOT|>\n")}), "### Response:\n"),
    "deepseek2": _each(_by_role({"system": _wrap("", "\n\n"), "user": _wrap("User: ", "\n\n"),
                                 "assistant": _wrap("Assistant: ", "<｜end▁of▁sentence｜>")}), "Assistant:"),
    "deepseek3": _each(_by_role({"system": _wrap("", "\n\n"), "user": _wrap("<｜User｜>", ""),
                                 "assistant": _wrap("<｜Assistant｜>", "<｜end▁of▁sentence｜>")}), "<｜Assistant｜>"),
    "deepseek-ocr": _each("{{ m.content }}"),
    "command-r": _each(_by_role({r: _wrap(f"<|START_OF_TURN_TOKEN|><|{tok}_TOKEN|>", "<|END_OF_TURN_TOKEN|>", T)
                                 for r, tok in (("system", "SYSTEM"), ("user", "USER"), ("assistant", "CHATBOT"))}),
                       "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    "llama3": _each(_role_line("<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", T),
                    "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "chatglm3": _each(_role_line("<|", "|>\n ", ""), "<|assistant|>", before="{{- '[gMASK]sop' -}}"),
    "chatglm4": _each(_role_line("<|", "|>\n", ""), "<|assistant|>\n", before="{{- '[gMASK]<sop>' -}}"),
    "glmedge": _each(_role_line("<|", "|>\n", ""), "<|assistant|>"),
    "minicpm": _each(_by_role({"user": _wrap("<用户>", "<AI>", T)}, T)),
    "exaone3": _exaone("[|system|]", "[|user|]", "[|assistant|]", None, "[|endofturn|]\n", "[|assistant|]"),
    "exaone4": _exaone("[|system|]", "[|user|]", "[|assistant|]", "[|tool|]", "[|endofturn|]\n", "[|assistant|]"),
    "exaone-moe": _exaone("<|system|>\n", "<|user|>\n", "<|assistant|>\n", "<|tool|>\n", "<|endofturn|>\n",
                          "<|assistant|>\n", user_end="<|endofturn|>\n"),
    "rwkv-world": _each(_by_role({"system": _wrap("System: ", "\n\n", T),
                                  "user": _wrap("User: ", "\n\n", T) + " + ('Assistant:' if loop.last else '')",
                                  "assistant": _wrap("Assistant: ", "\n\n", T)})),
    "granite": _granite(False),
    "granite-4.0": _granite(True),
    "granite-4.1": _granite(True),
    "gigachat": ("{%- set has_system = messages and messages[0].role == 'system' -%}"
                 "{{ '<s>' + (messages[0].content + '<|message_sep|>' if has_system else '') }}"
                 + _each("{%- if not (loop.first and has_system) -%}"
                         + _by_role({"user": _wrap("user<|role_sep|>",
                                                   "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>"),
                                     "assistant": _wrap("assistant<|role_sep|>", "<|message_sep|>")})
                         + "{%- endif -%}", "assistant<|role_sep|>")),
    "megrez": _each(_role_line("<|role_start|>", "<|role_end|>", "<|turn_end|>"),
                    "<|role_start|>assistant<|role_end|>"),
    "yandex": _each(_by_role({"user": _wrap(" Пользователь: ", "\n\n"), "assistant": _wrap(" Ассистент: ", "\n\n")}),
                    " Ассистент:[SEP]"),
    "bailing": _bailing(False),
    "bailing-think": _bailing(True),
    "bailing2": ("{%- if not (messages and messages[0].role == 'system') -%}"
                 "{{ '<role>SYSTEM</role>detailed thinking off<|role_end|>' }}{%- endif -%}"
                 + _each("{%- set role = 'HUMAN' if m.role == 'user' else m.role|upper -%}"
                         "{{ '<role>' + role + '</role>' + m.content + '<|role_end|>' }}", "<role>ASSISTANT</role>")),
    "llama4": _each(_role_line("<|header_start|>", "<|header_end|>\n\n", "<|eot|>", T),
                    "<|header_start|>assistant<|header_end|>\n\n"),
    "smolvlm": _each(_by_role({"system": _wrap("", "\n\n"), "user": _wrap("User: ", "<end_of_utterance>\n")},
                              _wrap("Assistant: ", "<end_of_utterance>\n")),
                     "Assistant:", before="{{- '<|im_start|>' -}}"),
    "hunyuan-moe": _each(_by_role({"system": _wrap("<|startoftext|>", "<|extra_4|>"),
                                   "assistant": _wrap("", "<|eos|>")}, _wrap("<|startoftext|>", "<|extra_0|>"))),
    "gpt-oss": _each("{{ '<|start|>' + m.role + '<|message|>' + m.content + "
                     "('<|return|>' if m.role == 'assistant' else '<|end|>') }}", "<|start|>assistant"),
    "hunyuan-dense": _each("{%- if loop.first and m.role == 'system' -%}{{ m.content + '<｜hy_place▁holder▁no▁3｜>' }}"
                           "{%- endif -%}"
                           + _by_role({"assistant": _wrap("<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁2｜>"),
                                       "user": _wrap("<｜hy_User｜>", "<｜hy_Assistant｜>")})),
    "hunyuan-vl": _each("{%- if loop.first and m.role == 'system' -%}{{ m.content + '<｜hy_place▁holder▁no▁3｜>' }}"
                        "{%- else -%}" + _by_role({"user": _wrap("", "<｜hy_User｜>"),
                                                   "assistant": _wrap("", "<｜hy_Assistant｜>")}) + "{%- endif -%}",
                        before="{{- '<｜hy_begin▁of▁sentence｜>' -}}"),
    "kimi-k2": _each(_by_role({"system": "'<|im_system|>system<|im_middle|>' + m.content + '<|im_end|>'",
                               "user": "'<|im_user|>user<|im_middle|>' + m.content + '<|im_end|>'",
                               "assistant": "'<|im_assistant|>assistant<|im_middle|>' + m.content + '<|im_end|>'",
                               "tool": "'<|im_system|>tool<|im_middle|>' + m.content + '<|im_end|>'"},
                              C + " + '<|im_end|>'"),
                     "<|im_assistant|>assistant<|im_middle|>"),
    "seed_oss": _each("{{ '<seed:bos>' + m.role + '\\n' + ((m.content|trim) if m.role == 'assistant' else m.content)"
                      " + '<seed:eos>' }}", "<seed:bos>assistant\n"),
    "grok-2": _each(_by_role({"system": _wrap("System: ", "<|separator|>\n\n", T),
                              "user": _wrap("Human: ", "<|separator|>\n\n", T),
                              "assistant": _wrap("Assistant: ", "<|separator|>\n\n")}), "Assistant:"),
    "pangu-embedded": _each("{%- if loop.first and m.role != 'system' -%}{{ '[unused9]系统：[unused10]' }}{%- endif -%}"
                            + _by_role({r: _wrap(f"[unused9]{word}：", "[unused10]") for r, word in
                                        (("system", "系统"), ("user", "用户"), ("assistant", "助手"), ("tool", "工具"),
                                         ("function", "方法"))}), "[unused9]助手："),
    "solar-open": _each(_role_line("<|begin|>", "<|content|>", "<|end|>"), "<|begin|>assistant"),
}


def builtin_template(name: str) -> str:
    """The Jinja source of llama.cpp's built-in template `name`; ValueError listing the names
    (and the closest) for one it does not know."""
    source = BUILTIN.get(name)
    if source is None:
        close = difflib.get_close_matches(name, BUILTIN, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ValueError(f"no built-in chat template named '{name}': {hint}the names are {', '.join(sorted(BUILTIN))} "
                         "(or give a Jinja file with --chat-template-file)")
    return source
