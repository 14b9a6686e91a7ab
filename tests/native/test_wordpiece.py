"""The WordPiece (BERT) tokenizer against Hugging Face's own: all-MiniLM-L6-v2's GGUF (converted by
bubo.convert) against its tokenizer.json run by the `tokenizers` package, on tricky strings,
sentences, every code point alone and random text; tiny synthetic vocabularies for the
normaliser's options; the pieces tokens detokenize to."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from bubo._tokenizer import TOKEN_ATTR_CONTROL, Tokenizer
from bubo.errors import GGUFError

import tokvocab as tv
from tokvocab import VT

# Code points that csrc/text/wordpiece_tables.h (Unicode 14) treats otherwise than HF's older
# category and NFD tables (and newer lowercasing), each alone; all encoded after Unicode 8.
# Made by `python3.11 csrc/text/gen_wordpiece.py --against-hf`: 559 code points in 116 ranges.
HF_UNICODE_DIFFERENCES = (
    (0x61D, 0x61D), (0x7FD, 0x7FD), (0x890, 0x891), (0x898, 0x89F), (0x8CA, 0x8E2), (0x9FD, 0x9FE), (0xA76, 0xA76),
    (0xAFA, 0xAFF), (0xB55, 0xB55), (0xC04, 0xC04), (0xC3C, 0xC3C), (0xC77, 0xC77), (0xC84, 0xC84), (0xD00, 0xD00),
    (0xD3B, 0xD3C), (0xD81, 0xD81), (0xEBA, 0xEBA), (0x166D, 0x166D), (0x1734, 0x1734), (0x180F, 0x180F),
    (0x1885, 0x1886), (0x1ABF, 0x1ACE), (0x1B7D, 0x1B7E), (0x1C89, 0x1C89), (0x1DF6, 0x1DFB), (0x2E43, 0x2E4F),
    (0x2E52, 0x2E5D), (0xA7CB, 0xA7CC), (0xA7CE, 0xA7CE), (0xA7D2, 0xA7D2), (0xA7D4, 0xA7D4), (0xA7DA, 0xA7DA),
    (0xA7DC, 0xA7DC), (0xA82C, 0xA82C), (0xA8C5, 0xA8C5), (0xA8FF, 0xA8FF), (0xA9BD, 0xA9BD), (0x10D24, 0x10D27),
    (0x10D50, 0x10D65), (0x10EAB, 0x10EAD), (0x10F46, 0x10F50), (0x10F55, 0x10F59), (0x10F82, 0x10F89),
    (0x11070, 0x11070), (0x11073, 0x11074), (0x110C2, 0x110C2), (0x110CD, 0x110CD), (0x111C9, 0x111C9),
    (0x111CF, 0x111CF), (0x1123E, 0x1123E), (0x1133B, 0x1133B), (0x11438, 0x1143F), (0x11442, 0x11444),
    (0x11446, 0x11446), (0x1144B, 0x1144F), (0x1145A, 0x1145B), (0x1145D, 0x1145E), (0x11660, 0x1166C),
    (0x116B9, 0x116B9), (0x1182F, 0x11837), (0x11839, 0x1183B), (0x11938, 0x11938), (0x1193B, 0x1193C),
    (0x1193E, 0x1193E), (0x11943, 0x11946), (0x119D4, 0x119D7), (0x119DA, 0x119DB), (0x119E0, 0x119E0),
    (0x119E2, 0x119E2), (0x11A01, 0x11A0A), (0x11A33, 0x11A38), (0x11A3B, 0x11A47), (0x11A51, 0x11A56),
    (0x11A59, 0x11A5B), (0x11A8A, 0x11A96), (0x11A98, 0x11A9C), (0x11A9E, 0x11AA2), (0x11C30, 0x11C36),
    (0x11C38, 0x11C3D), (0x11C3F, 0x11C3F), (0x11C41, 0x11C45), (0x11C70, 0x11C71), (0x11C92, 0x11CA7),
    (0x11CAA, 0x11CB0), (0x11CB2, 0x11CB3), (0x11CB5, 0x11CB6), (0x11D31, 0x11D36), (0x11D3A, 0x11D3A),
    (0x11D3C, 0x11D3D), (0x11D3F, 0x11D45), (0x11D47, 0x11D47), (0x11D90, 0x11D91), (0x11D95, 0x11D95),
    (0x11D97, 0x11D97), (0x11EF3, 0x11EF4), (0x11EF7, 0x11EF8), (0x11FFF, 0x11FFF), (0x12FF1, 0x12FF2),
    (0x13430, 0x13438), (0x16E97, 0x16E9A), (0x16EA0, 0x16EB8), (0x16F4F, 0x16F4F), (0x16FE2, 0x16FE2),
    (0x16FE4, 0x16FE4), (0x1CF00, 0x1CF2D), (0x1CF30, 0x1CF46), (0x1E000, 0x1E006), (0x1E008, 0x1E018),
    (0x1E01B, 0x1E021), (0x1E023, 0x1E024), (0x1E026, 0x1E02A), (0x1E130, 0x1E136), (0x1E2AE, 0x1E2AE),
    (0x1E2EC, 0x1E2EF), (0x1E944, 0x1E94A), (0x1E95E, 0x1E95F),
)
KNOWN_DIFFERENT = frozenset(cp for a, b in HF_UNICODE_DIFFERENCES for cp in range(a, b + 1))

LONG_WORD = "pneumonoultramicroscopicsilicovolcanoconiosis" * 3  # 135 letters: one [UNK]

TRICKY = [
    "", " ", "   \t\n  ", "\n", "\r\n\r\n", "\t\tindented\ttext",
    "Hello, World!", "HELLO WORLD", "hello world", "Hello    world", "  leading and trailing  ",
    # accents: precomposed, combining, stacked, uppercase
    "café", "cafe\u0301", "naïve résumé", "ÉCOLE", "Ångström", "crème brûlée", "Zoë", "a\u0300\u0301\u0302b",
    "\u0301alone", "x\u20dd", "Ǆemal ǅ ǆ", "ﬁne ﬂow", "Œuvre æther",
    # case: Turkish dotted I, German sharp s, Greek sigma, Kelvin/Ohm signs, Cyrillic, Armenian
    "İstanbul", "ISTANBUL ıi", "Straße STRASSE ẞ", "ΟΔΟΣ ΣΊΣΥΦΟΣ", "Σ σ ς", "\u212a \u2126 \u212b",
    "ПРИВЕТ МИР", "Привет, мир!", "ԱՐՄԵՆ", "ǅungla",
    # CJK ideographs (split), kana and hangul (not split), fullwidth forms, compatibility ideographs
    "我爱北京天安门", "中文english混合text", "日本語のテキスト", "こんにちは世界", "カタカナ ひらがな",
    "안녕하세요 세계", "한국어텍스트", "ＡＢＣ１２３！", "\uf900\uf901\ufa0a", "\U00020000\U0002a6d6",
    "㐀㐁 \u3000 全角\u3000スペース", "。、「」『』",
    # emoji, joiners, variation selectors
    "😀😃😄", "I ❤️ NY", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "a\u200db", "a\u200cb", "x\ufe0fy", "a\u2060b",
    # punctuation, ASCII and Unicode
    "Well... really?!", "“quoted” and ‘single’", "em—dash – en-dash", "«guillemets» ¿qué? ¡sí!", "a/b\\c|d",
    "$100 + 20% = #1 @home ^_^ ~tilde~ `tick`", "(parens) [brackets] {braces} <angles>", "a·b•c", "§1 ¶2 †3",
    "...!!!???,,,", "foo_bar-baz", "x²+y³=z⁴", "½ ¼ ⅓",
    # controls, format, replacement, NUL, separators
    "a\x00b", "a\x01b\x7fc", "bell\x07ring", "a\ufffdb", "\ufffd", "soft\u00adhyphen", "bidi\u200e\u200fmarks",
    "line\u2028sep\u2029para", "nbsp\u00a0here", "thin\u2009space", "ideo\u3000space", "nel\x85next", "vt\x0bff\x0c",
    "\ue000private\U000f0000", "tag\U000e0041s",
    # vocabulary edges: long words, unknown pieces, the phantom space itself, continuation text
    LONG_WORD, "a" * 100, "a" * 101, "é" * 101, "x" * 99 + "\u0301", "qxzvjq", "ⓧⓨⓩ", "\u2581", "a\u2581b",
    "\u2581\u2581hello", "##ing", "#hashtag", "un##affable", "unaffable", "tokenization", "antidisestablishment",
    # numbers, URLs, code
    "3.14159", "1,000,000", "2024-01-15T10:30:00Z", "0xDEADBEEF", "٣٤٥ ๓๔๕", "१२३",
    "https://example.com/path?q=1&r=two#frag", "user.name+tag@example.co.uk",
    "def f(x): return x**2  # square", "if (a && b) { c[i] = d->e; }", "SELECT * FROM t WHERE id=1;",
    "<html><body class=\"x\">hi</body></html>", '{"key": [1, 2.5, null, true]}',
    # special tokens in text
    "[CLS] inside text", "text [SEP] more", "[MASK]", "[PAD][UNK][CLS][SEP][MASK]", "[cls] lower case",
    "[ CLS ]", "a[MASK]b", "[[CLS]]", "[UNK]nown", "[unused0] [unused1]",
    # other scripts
    "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Γειά σου Κόσμε", "ᚠᛇᚻ᛫ᛒᛦᚦ", "ⴰⵣⵓⵍ",
    "Tiếng Việt có dấu", "Ελληνικά ΆΈΉΊΌΎΏ", "Ærøskøbing", "Łódź Żółć", "Čeština ŘŠŽ", "ﷺ ﷽",
]

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "This framework generates embeddings for each input sentence.",
    "Sentences are passed as a list of strings.",
    "The weather in Paris is lovely in the spring, isn't it?",
    "I can't believe it's already 2024 — time flies!",
    "Dr. Smith's lab published 3 papers in Nature (2023).",
    "She said, \"Don't worry; we'll fix it tomorrow.\"",
    "E-mail me at jane.doe@example.org or call +1 (555) 010-9999.",
    "The U.S.A. and the U.K. signed the treaty on Jan. 5th.",
    "Machine learning models require large amounts of training data.",
    "Embeddings map text into a vector space where similar meanings are close.",
    "Python 3.11 added faster CPython and better error messages.",
    "What's the difference between a list and a tuple?",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein.",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "¿Dónde está la biblioteca? Está cerca de la estación.",
    "Não sei se vou conseguir chegar a tempo.",
    "Il était une fois, dans un pays lointain, une princesse.",
    "Søren Kierkegaard was a Danish philosopher.",
    "Москва — столица России.",
    "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "東京は日本の首都です。",
    "北京是中华人民共和国的首都。",
    "서울은 대한민국의 수도입니다.",
    "Istanbul, formerly Constantinople, straddles Europe and Asia.",
    "The café served crème brûlée and a croque-monsieur.",
    "Résumé writing tips: be concise, be specific, and proofread!",
    "He scored 98.6% on the exam, beating last year's 87.2%.",
    "Version 2.0.1-beta was released on 2023-11-30.",
    "Use `pip install tokenizers` to get the library.",
    "for i in range(10): print(i ** 2)",
    "The function returns NULL if the allocation fails.",
    "CamelCaseIdentifiers and snake_case_identifiers look different.",
    "#MachineLearning #AI @OpenSource",
    "Wow!!! That's AMAZING!!! 😍😍😍",
    "I love New York ❤️ and San Francisco 🌉.",
    "Price: €12.50 / £10.99 / ¥1500 / $13.75",
    "Temperature: −5 °C at 06:00, rising to 12 °C by noon.",
    "The mitochondria is the powerhouse of the cell.",
    "Antidisestablishmentarianism is a very long word.",
    "Supercalifragilisticexpialidocious!",
    "Hello\tworld\nnew line\r\nwindows line",
    "Tokenization splits text into subword units like un ##aff ##able.",
    "Photosynthesis converts light energy into chemical energy.",
    "The Eiffel Tower is 330 metres (1,083 ft) tall.",
    "In 1969, Apollo 11 landed on the Moon.",
    "She sells seashells by the seashore.",
    "To be, or not to be: that is the question.",
    "All happy families are alike; each unhappy family is unhappy in its own way.",
    "It was the best of times, it was the worst of times.",
    "Call me Ishmael.",
    "The sky above the port was the color of television, tuned to a dead channel.",
    "A journey of a thousand miles begins with a single step.",
]


@pytest.fixture(scope="module")
def minilm(minilm_gguf, minilm_source):
    """(bubo's tokenizer from the GGUF, HF's from tokenizer.json without its 128-token truncation
    and padding, which are the embedding code's business)."""
    hf = HFTokenizer.from_file(str(minilm_source / "tokenizer.json"))
    hf.no_truncation()
    hf.no_padding()
    return Tokenizer(minilm_gguf), hf


def mismatches(tok: Tokenizer, hf: HFTokenizer, texts, add_special: bool = True) -> list[tuple[str, list, list]]:
    wrong = []
    for text in texts:
        ours = tok.encode(text, add_special=add_special, parse_special=True)
        theirs = hf.encode(text, add_special_tokens=add_special).ids
        if ours != theirs:
            wrong.append((text, ours, theirs))
    return wrong


def report(wrong) -> str:
    return "\n".join(f"{text!r}:\n  bubo {ours}\n  hf   {theirs}" for text, ours, theirs in wrong)


# ---- all-MiniLM-L6-v2 against its tokenizer.json ------------------------------------------------


@pytest.mark.models
def test_metadata(minilm):
    tok, _ = minilm
    assert (tok.model, tok.n_vocab, tok.warning) == ("bert", 30522, None)
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (101, 102, 100, 0)
    assert (tok.special_id("sep"), tok.special_id("mask")) == (102, 103)
    assert (tok.add_bos, tok.add_sep, tok.add_eos, tok.add_space_prefix) == (True, True, False, False)
    assert all(tok.is_control(i) for i in (0, 100, 101, 102, 103))
    assert not tok.is_control(1)  # [unused0] is an ordinary token


@pytest.mark.models
def test_tricky_strings_match_hf(minilm):
    wrong = mismatches(*minilm, TRICKY)
    assert not wrong, report(wrong)


@pytest.mark.models
def test_sentences_match_hf(minilm):
    assert len(SENTENCES) >= 50
    wrong = mismatches(*minilm, SENTENCES)
    wrong += mismatches(*minilm, [" ".join(SENTENCES)])
    assert not wrong, report(wrong)


@pytest.mark.models
def test_without_special_tokens_match_hf(minilm):
    tok, hf = minilm
    wrong = mismatches(tok, hf, TRICKY[:40] + SENTENCES[:10], add_special=False)
    assert not wrong, report(wrong)
    assert tok.encode("", add_special=False) == []


@pytest.mark.models
def test_special_token_text_is_text_without_parse_special(minilm):
    tok, hf = minilm
    hf.encode_special_tokens = True  # HF's switch for reading special-token text as text
    try:
        for text in ["[CLS] inside text", "a[MASK]b [SEP]", "[UNK]"]:
            assert tok.encode(text, parse_special=False) == hf.encode(text).ids, text
    finally:
        hf.encode_special_tokens = False
    assert 101 not in tok.encode("[CLS]", add_special=False, parse_special=False)


@pytest.mark.models
def test_every_code_point_alone_matches_hf(minilm):
    """Each code point between two letters ("a" c "a": clean_text, the classes, the
    normalisation, the split), but for the known differences. Planes 4-13 hold no characters."""
    tok, hf = minilm
    cps = [cp for cp in [*range(0x40000), *range(0xE0000, 0x110000)] if not 0xD800 <= cp <= 0xDFFF]
    block = 4096
    chunks = [cps[i:i + block] for i in range(0, len(cps), block)]
    texts = [" ".join(f"a{chr(cp)}a" for cp in chunk) for chunk in chunks]
    theirs = hf.encode_batch(texts)
    differ = set()
    for chunk, text, hf_enc in zip(chunks, texts, theirs):
        if tok.encode(text) == hf_enc.ids:
            continue
        for cp in chunk:  # find which
            if tok.encode(f"a{chr(cp)}a") != hf.encode(f"a{chr(cp)}a").ids:
                differ.add(cp)
    unexpected = sorted(differ - KNOWN_DIFFERENT)
    assert not unexpected, report((chr(cp), tok.encode(f"a{chr(cp)}a"), hf.encode(f"a{chr(cp)}a").ids)
                                  for cp in unexpected[:20])


# random text: any code point but the known differences, and pieces that make vocabulary hits,
# special tokens, marks and spaces likely
_char = st.characters(exclude_categories=("Cs",)).filter(lambda c: ord(c) not in KNOWN_DIFFERENT)
_pieces = st.sampled_from(["the", "Un", "affable", "ing", "##", " ", "  ", "\n", "[CLS]", "[SEP]", "[MASK]", "é",
                           "\u0301", "İ", "ß", "Σ", "中", "の", "한", ",", "—", "“", "\u200d", "\x00", "\ufffd",
                           "\u2581", "😀", "123", "x" * 60])
_text = st.lists(st.one_of(st.text(_char, min_size=1, max_size=6), _pieces), max_size=12).map("".join)


@pytest.mark.models
@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=_text)
def test_random_text_matches_hf(minilm, text):
    wrong = mismatches(*minilm, [text])
    assert not wrong, report(wrong)


@pytest.mark.models
def test_pieces(minilm):
    tok, hf = minilm
    hello, ing = hf.token_to_id("hello"), hf.token_to_id("##ing")
    assert tok.token_text(hello) == "\u2581hello".encode()
    assert tok.token_to_piece(hello) == b" hello"
    assert tok.token_text(ing) == tok.token_to_piece(ing) == b"ing"
    assert tok.token_to_piece(101) == b"[CLS]" and tok.token_to_piece(101, special=False) == b""
    assert tok.token_to_piece(100, special=False) == b""
    assert tok.token_to_piece(1) == b"[unused0]"  # an ordinary token with no phantom space
    for id in range(tok.n_vocab):
        text = tok.token_text(id)
        if tok.token_attr(id) & TOKEN_ATTR_CONTROL:
            assert tok.token_to_piece(id, special=False) == b""
        else:
            assert tok.token_to_piece(id) == text.replace("\u2581".encode(), b" ")


@pytest.mark.models
def test_decode(minilm):
    tok, hf = minilm
    # llama.cpp's detokenizer: words keep the space before them, and its clean-up (" ," -> ",")
    ids = tok.encode("Hello, world! Tokenization isn't hard.")
    assert tok.decode(ids, skip_special=True) == " hello, world! tokenization isn't hard."
    assert tok.decode(ids) == "[CLS] hello, world! tokenization isn't hard.[SEP]"
    # the same text as HF's WordPiece decoder, but for that first space and apostrophes (llama.cpp's
    # clean-up joins " ' " where HF's leaves "isn ' t")
    for text in [s for s in SENTENCES[:30] if "'" not in s]:
        ids = tok.encode(text)
        assert tok.decode(ids, skip_special=True) == " " + hf.decode(ids), text
    # streaming: the pieces themselves, without the clean-up
    d = tok.detokenizer(skip_special=True)
    assert "".join(d.feed(i) for i in tok.encode("unaffable, really")) + d.flush() == " unaffable , really"


# ---- synthetic vocabularies: the normaliser's options -------------------------------------------

VOCAB = ["hello", "world", "cafe", "café", "Cafe", "CAFE", "é", "e", "a", "b", "x", "Hello", "HELLO", "##llo", "##o",
         "##s", "##é", "##e", "##\u0301", "\u0301", "中", "文", "中文", "##文", "i", "##i", "istanbul", "İstanbul",
         "ı", "un", "##aff", "##able", "!", ",", ".", "straße", "strasse", "##ß", "ς", "σ", "##ς", "##σ", "a" * 8,
         "##" + "a" * 8]
STRINGS = ["Hello, world!", "HELLO café CAFE Café", "cafe\u0301 é\u0301", "İstanbul ISTANBUL ıstanbul", "中文 文中x",
           "unaffable UNAFFABLE", "Straße STRASSE", "ΣΑΣ σας", "a" * 20, "a" * 21, "xa" * 10 + "x", "world" * 5]


def hf_wordpiece(lowercase: bool, strip_accents: bool, chinese_chars: bool, max_chars: int) -> HFTokenizer:
    """HF's tokenizer over VOCAB with the same specials and options."""
    vocab = {t: i for i, t in enumerate(tv.WPM_SPECIALS + VOCAB)}
    hf = HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=max_chars))
    hf.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese_chars,
                                               strip_accents=strip_accents, lowercase=lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                      special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    hf.decoder = decoders.WordPiece()
    hf.add_special_tokens(tv.WPM_SPECIALS)
    return hf


@pytest.mark.parametrize("lowercase, strip_accents, chinese_chars, max_chars",
                         [(True, True, True, 100), (False, False, True, 100), (True, False, False, 20),
                          (False, True, True, 7)])
def test_options_match_hf(lowercase, strip_accents, chinese_chars, max_chars):
    key = "tokenizer.ggml.wordpiece."
    tok = Tokenizer.from_bytes(tv.write_gguf(tv.wpm_kv(VOCAB, **{
        key + "lowercase": (VT.BOOL, lowercase), key + "strip_accents": (VT.BOOL, strip_accents),
        key + "chinese_chars": (VT.BOOL, chinese_chars), key + "max_input_chars_per_word": (VT.UINT32, max_chars)})))
    hf = hf_wordpiece(lowercase, strip_accents, chinese_chars, max_chars)
    wrong = mismatches(tok, hf, STRINGS + TRICKY)
    assert not wrong, report(wrong)


def test_options_default_to_bert_uncased():
    tok = Tokenizer.from_bytes(tv.write_gguf(tv.wpm_kv(VOCAB)))
    hf = hf_wordpiece(True, True, True, 100)
    wrong = mismatches(tok, hf, STRINGS + TRICKY)
    assert not wrong, report(wrong)
    assert (tok.model, tok.bos_id, tok.eos_id, tok.unk_id, tok.add_sep) == ("bert", 2, 3, 1, True)


def test_add_eos_token_does_not_add_a_second_sep():
    """gguf-py's SpecialVocab (llama.cpp's converter) writes add_eos_token = true with eos = [SEP]
    for BERT; WordPiece still ends with one [SEP], as llama.cpp's tokenizer does."""
    plain = Tokenizer.from_bytes(tv.write_gguf(tv.wpm_kv(VOCAB)))
    tok = Tokenizer.from_bytes(tv.write_gguf(tv.wpm_kv(VOCAB, **{"tokenizer.ggml.add_eos_token": (VT.BOOL, True)})))
    assert tok.encode("hello world") == plain.encode("hello world")
    assert tok.encode("hello world")[-1] == 3 and tok.encode("hello world")[-2] != 3


def test_add_sep_token_off():
    tok = Tokenizer.from_bytes(tv.write_gguf(tv.wpm_kv(VOCAB, **{"tokenizer.ggml.add_sep_token": (VT.BOOL, False)})))
    assert tok.encode("hello") == [2, tok.encode("hello", add_special=False)[0]]


@pytest.mark.parametrize("key, value", [("lowercase", (VT.UINT32, 1)), ("strip_accents", (VT.STRING, "yes")),
                                        ("max_input_chars_per_word", (VT.BOOL, True)),
                                        ("max_input_chars_per_word", (VT.INT32, -1))])
def test_option_of_the_wrong_type_is_a_format_error(key, value):
    kv = tv.wpm_kv(VOCAB, **{"tokenizer.ggml.wordpiece." + key: value})
    with pytest.raises(GGUFError, match="tokenizer.ggml.wordpiece." + key):
        Tokenizer.from_bytes(tv.write_gguf(kv))
