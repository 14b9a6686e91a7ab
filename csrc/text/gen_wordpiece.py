#!/usr/bin/env python3
"""Generate csrc/text/wordpiece_tables.h: the Unicode data of BERT's normaliser and pre-tokenizer.

    python3.11 csrc/text/gen_wordpiece.py > csrc/text/wordpiece_tables.h
    python3.11 csrc/text/gen_wordpiece.py --against-hf   # where the tables and HF's disagree

The WordPiece tokenizer (wpm.c) does what Hugging Face's BertNormalizer, BertPreTokenizer and
WordPiece do (the `tokenizers` Rust crate). Per code point it needs:

- a class (class runs): dropped by clean_text (Cc, Cf, Co, Cs except \\t \\n \\r; U+0000 and
  U+FFFD), white space (the White_Space property, which clean_text maps to a space and the
  pre-tokenizer splits on), punctuation (BERT's _is_punctuation: ASCII 33-47, 58-64, 91-96,
  123-126, or \\p{P}; a word of its own), a nonspacing mark (Mn, which strip_accents drops) or a
  "Chinese character" (the CJK ranges of BERT's _is_chinese_char, spaced apart). The class of
  each ASCII code point is also written out as a plain array for the fast path.
- the strip-accents map: a code point to its canonical decomposition (NFD) without the Mn
  marks, where that differs from the code point and the code point is not itself Mn (the class
  says to drop those). Hangul syllables are left out: wpm.c decomposes them arithmetically.
  Canonical reordering is per string, not per code point; the marks it reorders are dropped
  anyway, so doing it per code point gives the same text except around the rare Mc marks with
  a nonzero combining class.
- the lowercase map: a code point to str.lower() of it (full lowercasing, as Rust's
  char::to_lowercase: U+0130 gives two code points), where that differs. Python lowercases a
  lone capital sigma to σ, as Rust does; final-sigma context does not arise per code point.

Unicode version. The tables come from this Python's unicodedata, which must be Unicode 14.0.0
(Python 3.11) unless --any-version is given. HF's crate takes the categories and NFD from older
crates (unicode_categories, unicode-normalization-alignments: Unicode 8-9 era) and lowercases
with the Rust standard library (Unicode 16 in current builds); every version since then is
only further from the categories, so the oldest Python we have is the nearest. Measured with
tokenizers 0.23 (--against-hf): 559 code points of 0x110000 are treated differently, all in
scripts and blocks encoded after Unicode 8 (new marks HF keeps, new format characters HF
keeps, new punctuation HF does not split, a few letters HF lowercases and we do not). The
pre-tokenizers' table (unicode_tables.h, Unicode 15.1 as llama.cpp's) is not used here: it
would add the punctuation and marks of 15.0 and 15.1 to that list.

Storage: class runs are sorted uint32 (first code point << 8 | class), one per maximal run of
one class; maps are a sorted key array, a value array (offset into the pool << 3 | length) and
a pool of code points. Lookups are binary searches."""

from __future__ import annotations

import sys
import unicodedata

EXPECTED_VERSION = "14.0.0"
MAX_CODEPOINT = 0x110000

# Must match the BUBO_WPM_* values in csrc/text/text_internal.h.
WPM_OTHER = 0
WPM_DROP = 1
WPM_SPACE = 2
WPM_PUNCT = 3
WPM_MARK = 4
WPM_CHINESE = 5

# BERT's _is_chinese_char, as HF's Rust code has it (0x2B920, where BERT has 0x2B820)
CHINESE_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
                  (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))

HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3


def is_chinese(cp: int) -> bool:
    return any(a <= cp <= b for a, b in CHINESE_RANGES)


def is_white_space(cp: int) -> bool:
    # The White_Space property (Rust's char::is_whitespace). Python's isspace() also counts
    # U+001C..U+001F, which are not White_Space (and are controls, dropped before this matters).
    return chr(cp).isspace() and not 0x1C <= cp <= 0x1F


def is_bert_punct(cp: int) -> bool:
    return (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
            or unicodedata.category(chr(cp)).startswith("P"))


def class_of(cp: int) -> int:
    cat = unicodedata.category(chr(cp))
    if cp in (0, 0xFFFD) or (cat in ("Cc", "Cf", "Co", "Cs") and cp not in (9, 10, 13)):
        return WPM_DROP
    if is_white_space(cp):
        return WPM_SPACE
    if is_bert_punct(cp):
        return WPM_PUNCT
    if cat == "Mn":
        return WPM_MARK
    if is_chinese(cp):
        return WPM_CHINESE
    return WPM_OTHER


def strip_accents(cp: int) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", chr(cp)) if unicodedata.category(c) != "Mn")


def hangul_decompose(cp: int) -> str:
    # The arithmetic of Unicode 3.12, as wpm.c does it
    s = cp - HANGUL_FIRST
    lead, vowel, trail = 0x1100 + s // 588, 0x1161 + (s % 588) // 28, 0x11A7 + s % 28
    return chr(lead) + chr(vowel) + (chr(trail) if trail != 0x11A7 else "")


def normalize(c: str, lowercase: bool = True, strip: bool = True, chinese: bool = True) -> str:
    """One code point through BertNormalizer, as wpm.c does it with these tables."""
    cp = ord(c)
    cls = class_of(cp)
    if cls == WPM_DROP:
        return ""
    if cls == WPM_SPACE:
        return " "
    out = strip_accents(cp) if strip else c
    if lowercase:
        out = "".join(x.lower() for x in out)
    return f" {out} " if chinese and cls == WPM_CHINESE else out


def pool_map(pairs: list[tuple[int, str]]) -> tuple[list[int], list[int], list[int]]:
    keys, vals, pool = [], [], []
    index: dict[str, int] = {}
    for cp, s in pairs:
        assert len(s) < 8, (hex(cp), s)
        if s not in index:
            index[s] = len(pool)
            pool.extend(ord(x) for x in s)
        keys.append(cp)
        vals.append(index[s] << 3 | len(s))
    return keys, vals, pool


def write_array(out, ctype: str, name: str, values: list[int], per_line: int, fmt: str = "0x{:x}") -> None:
    out.write(f"static const {ctype} {name}[{max(len(values), 1)}] = {{\n")
    for i in range(0, len(values), per_line):
        out.write("    " + ", ".join(fmt.format(v) for v in values[i:i + per_line]) + ",\n")
    if not values:
        out.write("    0,\n")
    out.write("};\n\n")


def check_assumptions() -> None:
    for cp in range(HANGUL_FIRST, HANGUL_LAST + 1):
        assert unicodedata.normalize("NFD", chr(cp)) == hangul_decompose(cp), hex(cp)
    for cp in range(128):  # wpm.c lowercases ASCII itself
        want = chr(cp + 32) if 65 <= cp <= 90 else chr(cp)
        assert chr(cp).lower() == want and strip_accents(cp) == chr(cp)
    for cp in range(MAX_CODEPOINT):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        # the pre-tokenizer looks at the classes of normalised text: normalising must not make
        # a character that clean_text would have removed or turned into a space
        for x in strip_accents(cp) + chr(cp).lower():
            if class_of(cp) not in (WPM_DROP, WPM_SPACE):
                assert class_of(ord(x)) not in (WPM_DROP, WPM_SPACE), hex(cp)


def main() -> None:
    version = unicodedata.unidata_version
    if version != EXPECTED_VERSION and "--any-version" not in sys.argv:
        raise SystemExit(f"unicodedata is Unicode {version}; the tables are made from {EXPECTED_VERSION}, the nearest "
                         "to HF tokenizers' (run with python3.11, or pass --any-version)")
    if "--against-hf" in sys.argv:
        against_hf()
        return
    check_assumptions()

    runs: list[int] = []
    prev = -1
    for cp in range(MAX_CODEPOINT):
        cls = class_of(cp)
        if cls != prev:
            runs.append(cp << 8 | cls)
            prev = cls
    ascii_class = [class_of(cp) for cp in range(128)]

    strip_pairs = []
    lower_pairs = []
    for cp in range(128, MAX_CODEPOINT):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        if unicodedata.category(c) != "Mn" and not HANGUL_FIRST <= cp <= HANGUL_LAST:
            s = strip_accents(cp)
            if s != c:
                strip_pairs.append((cp, s))
        if c.lower() != c:
            lower_pairs.append((cp, c.lower()))
    strip_keys, strip_vals, strip_pool = pool_map(strip_pairs)
    lower_keys, lower_vals, lower_pool = pool_map(lower_pairs)

    out = sys.stdout
    out.write("/* Generated by csrc/text/gen_wordpiece.py from Python's unicodedata "
              f"(Unicode {version}; see there why this version). Do not edit. */\n")
    out.write("#ifndef BUBO_TEXT_WORDPIECE_TABLES_H\n#define BUBO_TEXT_WORDPIECE_TABLES_H\n\n")
    out.write("#include <stdint.h>\n\n")
    out.write(f'#define BUBO_WPM_UNICODE_VERSION "{version}"\n')
    out.write(f"#define BUBO_WPM_N_CLASS_RUNS {len(runs)}\n")
    out.write(f"#define BUBO_WPM_N_STRIP {len(strip_keys)}\n")
    out.write(f"#define BUBO_WPM_N_LOWER {len(lower_keys)}\n\n")
    out.write("/* class of each ASCII code point (BUBO_WPM_*) */\n")
    write_array(out, "uint8_t", "bubo_wpm_ascii_class", ascii_class, 32, "{}")
    out.write("/* first code point of each run of one class << 8 | the class (BUBO_WPM_*), sorted */\n")
    write_array(out, "uint32_t", "bubo_wpm_class_runs", runs, 8, "0x{:08x}")
    out.write("/* strip accents: code point -> NFD without Mn (not Mn themselves, not Hangul) */\n")
    write_array(out, "uint32_t", "bubo_wpm_strip_keys", strip_keys, 10)
    out.write("/* offset into bubo_wpm_strip_pool << 3 | number of code points */\n")
    write_array(out, "uint32_t", "bubo_wpm_strip_vals", strip_vals, 10)
    write_array(out, "uint32_t", "bubo_wpm_strip_pool", strip_pool, 10)
    out.write("/* lowercase: code point -> str.lower() (not ASCII) */\n")
    write_array(out, "uint32_t", "bubo_wpm_lower_keys", lower_keys, 10)
    out.write("/* offset into bubo_wpm_lower_pool << 3 | number of code points */\n")
    write_array(out, "uint32_t", "bubo_wpm_lower_vals", lower_vals, 10)
    write_array(out, "uint32_t", "bubo_wpm_lower_pool", lower_pool, 10)
    out.write("#endif\n")


def against_hf() -> None:
    """Print, as Python (first, last) ranges, the code points that these tables treat otherwise
    than HF's BertNormalizer (all options on) and BertPreTokenizer, each code point alone."""
    from tokenizers.normalizers import BertNormalizer
    from tokenizers.pre_tokenizers import BertPreTokenizer

    hf_norm = BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True)
    hf_pre = BertPreTokenizer()
    differ = []
    for cp in range(MAX_CODEPOINT):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        ours = normalize(c)
        if hf_norm.normalize_str(c) != ours:
            differ.append(cp)
            continue
        # split "a", c, "a": 1 word, 2 (white space) or 3 (punctuation)
        cls = class_of(cp)
        n_ours = 2 if cls == WPM_SPACE else 3 if cls == WPM_PUNCT else 1
        if ours and len(hf_pre.pre_tokenize_str("a" + c + "a")) != n_ours:
            differ.append(cp)
    ranges: list[list[int]] = []
    for cp in differ:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    print(f"# {len(differ)} code points in {len(ranges)} ranges")
    line = ""
    for a, b in ranges:
        item = f"(0x{a:X}, 0x{b:X}), "
        if len(line) + len(item) > 116:
            print(line.rstrip())
            line = ""
        line += item
    print(line.rstrip())


if __name__ == "__main__":
    main()
