"""The tokenizers against llama.cpp: the three catalog models on the shared oracle's strings and
on tests/data/tokenizer_extra.json (made by scripts/gen_tokenizer_extra.py with llama.cpp's own
llama-tokenize), round trips, the streaming detokenizer, and tiny synthetic vocabularies for
the rules the real ones do not isolate."""

from __future__ import annotations

import json
import pathlib
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bubo import store
from bubo._tokenizer import (
    TOKEN_ATTR_CONTROL,
    TOKEN_ATTR_NORMAL,
    TOKEN_ATTR_RSTRIP,
    TOKEN_ATTR_USER_DEFINED,
    Detokenizer,
    Tokenizer,
)
from bubo.errors import GGUFError, UnsupportedError

import tokvocab as tv
from reference.reader import reader
from tokvocab import TT, VT, bl

DATA = pathlib.Path(__file__).resolve().parent.parent / "data"
ORACLE = json.loads((DATA / "oracle" / "llamacpp.json").read_text())
EXTRA = json.loads((DATA / "tokenizer_extra.json").read_text())
CATALOG = ("smollm2:135m", "gemma3:270m", "qwen2.5-coder:0.5b")

REPLACEMENT = "\ufffd"


def cases(model: str) -> list[dict]:
    return ORACLE["models"][model]["tokenize"] + EXTRA["models"][model]["tokenize"]


@pytest.fixture(scope="module", params=CATALOG)
def catalog(request):
    return request.param, Tokenizer(store.pull(request.param))


# ---- the catalog models against llama.cpp -----------------------------------------------------


@pytest.mark.models
def test_catalog_metadata(catalog):
    name, tok = catalog
    want = {
        "smollm2:135m": ("gpt2", "smollm", 49152, 1, 2, False),
        "gemma3:270m": ("llama", "default", 262144, 2, 1, True),
        "qwen2.5-coder:0.5b": ("gpt2", "qwen2", 151936, 151643, 151645, False),
    }[name]
    assert (tok.model, tok.pre, tok.n_vocab, tok.bos_id, tok.eos_id, tok.add_bos) == want
    assert tok.warning is None
    assert not tok.add_eos
    assert tok.is_eog(tok.eos_id)


@pytest.mark.models
@pytest.mark.parametrize("source", ["oracle", "extra"])
def test_catalog_ids_match_llamacpp(catalog, source):
    name, tok = catalog
    data = (ORACLE if source == "oracle" else EXTRA)["models"][name]["tokenize"]
    assert len(data) >= 38
    wrong = []
    for case in data:
        plain = tok.encode(case["text"], add_special=False, parse_special=False)
        special = tok.encode(case["text"], add_special=True, parse_special=True)
        if plain != case["ids"] or special != case["ids_add_special_parse_special"]:
            wrong.append((case["text"][:40], plain[:12], case["ids"][:12]))
    assert not wrong, wrong


@pytest.mark.models
def test_catalog_encode_accepts_bytes(catalog):
    _, tok = catalog
    for case in cases(catalog[0])[:10]:
        assert tok.encode(case["text"].encode("utf-8"), add_special=False) == case["ids"]


def missing_bytes(tok: Tokenizer) -> set[int]:
    """Bytes a byte-level BPE vocabulary has no token for: llama.cpp drops them from the text."""
    if tok.model != "gpt2":
        return set()
    have = {tok.token_text(i) for i in range(tok.n_vocab)}
    return {b for b in range(256) if tv.BYTE_CHAR[b].encode() not in have}


def round_trips(tok: Tokenizer, missing: set[int], text: str) -> bool:
    """Whether llama.cpp gives the text back: byte-level BPE does unless the text has a byte its
    vocabulary lacks (SmolLM2 lacks 21, among them U+0004, U+0006, U+0013, U+0014, U+0016,
    U+001D and the lead bytes F1, F2 of planes 4-11); SentencePiece turns an U+2581 of the input
    into the space it stands for. None of the three cleans up spaces on decode."""
    if tok.model == "llama":
        return "\u2581" not in text
    return not missing.intersection(text.encode("utf-8"))


@pytest.mark.models
def test_catalog_decode_round_trip(catalog):
    name, tok = catalog
    missing = missing_bytes(tok)
    assert len(missing) == {"smollm2:135m": 21}.get(name, 0)
    lossy = 0
    for case in cases(name):
        text = case["text"]
        if not round_trips(tok, missing, text):
            lossy += 1
            assert tok.decode(case["ids"]) != text
            continue
        assert tok.decode(case["ids"]) == text
        # with special tokens parsed and rendered, the BOS the model adds is the only difference
        ids = case["ids_add_special_parse_special"]
        bos = tok.token_to_piece(tok.bos_id).decode() if tok.add_bos else ""
        assert tok.decode(ids) == bos + text
    assert lossy == {"smollm2:135m": 1}.get(name, 0)


@pytest.mark.models
def test_catalog_skip_special_drops_control_tokens(catalog):
    name, tok = catalog
    text = {"gemma3:270m": "<start_of_turn>user\nhi<end_of_turn>"}.get(name, "<|im_start|>user\nhi<|im_end|>")
    ids = tok.encode(text, add_special=True, parse_special=True)
    assert any(tok.is_control(i) for i in ids)
    assert tok.decode(ids, skip_special=True) == "user\nhi"
    assert tok.decode(ids) == (tok.token_to_piece(tok.bos_id).decode() if tok.add_bos else "") + text


def stream(tok: Tokenizer, ids: list[int], **kw) -> list[str]:
    d = tok.detokenizer(**kw)
    return [d.feed(i) for i in ids] + [d.flush()]


@pytest.mark.models
def test_catalog_streaming_never_splits_a_character(catalog):
    name, tok = catalog
    held_back = 0
    for case in cases(name):
        for ids, skip in ((case["ids"], False), (case["ids_add_special_parse_special"], False),
                          (case["ids_add_special_parse_special"], True)):
            chunks = stream(tok, ids, skip_special=skip)
            assert "".join(chunks) == tok.decode(ids, skip_special=skip)
            assert not any(REPLACEMENT in c for c in chunks)
            # a chunk is a str, so whole characters; count the tokens that ended inside one
            held_back += sum(1 for i, c in zip(ids, chunks) if c == "" and tok.token_to_piece(i, not skip))
    assert held_back > 0  # the strings do split characters across tokens (emoji, CJK, bytes)


@pytest.fixture(scope="module")
def smollm_metadata():
    """SmolLM2's tokenizer.* metadata, read with gguf.GGUFReader (reference.reader's)."""
    r = reader(store.pull("smollm2:135m"))
    kv = {}
    for key, field in r.fields.items():
        if key.startswith("tokenizer.") and key != "tokenizer.chat_template":
            vtype = field.types[0]
            kv[key] = (vtype, field.contents())
    return kv


@pytest.mark.models
@pytest.mark.parametrize("pre", sorted(EXTRA["pre_variants"]["ids"]))
def test_pre_tokenizers_on_a_real_vocabulary_match_llamacpp(smollm_metadata, pre):
    # SmolLM2's vocabulary and merges under another tokenizer.ggml.pre: every pre-tokenizer
    # against llama.cpp on the oracle's and the extra strings
    kv = dict(smollm_metadata)
    kv["tokenizer.ggml.pre"] = (VT.STRING, pre)
    tok = Tokenizer.from_bytes(tv.write_gguf(kv))
    variants = EXTRA["pre_variants"]
    wrong = [(t[:40], got[:10], want[:10]) for t, want in zip(variants["texts"], variants["ids"][pre])
             if (got := tok.encode(t, add_special=False)) != want]
    assert not wrong, wrong


# ---- property: byte-level BPE is lossless ------------------------------------------------------


@pytest.fixture(scope="module")
def catalog_all():
    out = {}
    for name in CATALOG:
        tok = Tokenizer(store.pull(name))
        out[name] = (tok, missing_bytes(tok))
    return out


# Any text (no surrogates: they are not UTF-8), with the characters that make tokenizers branch
# more likely than uniform sampling would.
TEXT = st.text(
    alphabet=st.one_of(
        st.characters(blacklist_categories=("Cs",)),
        st.sampled_from(list(" \t\n\r'sdmtlrve0123456789.,!?<>|éß🙂ＡﬁＡ\u00a0\u3000\u200d")),
    ),
    max_size=60,
)


@pytest.mark.models
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT)
def test_random_text_round_trips(catalog_all, text):
    for name, (tok, missing) in catalog_all.items():
        if not round_trips(tok, missing, text):
            continue
        ids = tok.encode(text, add_special=False)
        assert tok.decode(ids) == text, name
        assert "".join(stream(tok, ids)) == text, name


@pytest.mark.models
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=80))
def test_random_bytes(catalog_all, data):
    # not UTF-8: byte-level BPE sees U+FFFD for each bad byte (as llama.cpp); SentencePiece's
    # byte fallback gives the bytes back, but for spaces, whose U+2581 escape a stray lead byte
    # can split into byte tokens that then come back as the escape's bytes (llama.cpp's too)
    for name, (tok, _missing) in catalog_all.items():
        ids = tok.encode(data, add_special=False)
        assert all(0 <= i < tok.n_vocab for i in ids)
        pieces = b"".join(tok.token_to_piece(i) for i in ids)
        if tok.model == "llama" and b"\xe2\x96\x81" not in data:
            assert pieces.replace(b"\xe2\x96\x81", b" ") == data, name
        else:
            assert tok.encode(llamacpp_utf8_decode(data).encode("utf-8", "surrogatepass"), add_special=False) == ids


def llamacpp_utf8_decode(data: bytes) -> str:
    """unicode_cpts_from_utf8, transcribed: the lead byte's bit pattern gives the length, the
    continuation bytes are checked, overlong forms and surrogates pass; anything else is one
    U+FFFD for one byte. (A sequence past U+10FFFF, where llama.cpp would throw, is U+FFFD.)"""
    out, i, n = [], 0, len(data)
    while i < n:
        c = data[i]
        size = 1 if c < 0x80 else 0 if c < 0xC0 else 2 if c < 0xE0 else 3 if c < 0xF0 else 4 if c < 0xF8 else 0
        cont = data[i + 1 : i + size]
        if size == 1:
            out.append(chr(c))
        elif size and len(cont) == size - 1 and all(b & 0xC0 == 0x80 for b in cont):
            cp = c & (0x7F >> size)
            for b in cont:
                cp = cp << 6 | (b & 0x3F)
            if cp <= 0x10FFFF:
                out.append(chr(cp))
                i += size
                continue
            out.append("\ufffd")
            size = 1
        else:
            out.append("\ufffd")
            size = 1
        i += size
    return "".join(out)


# ---- threads ------------------------------------------------------------------------------------


@pytest.mark.models
def test_tokenize_from_many_threads_at_once(catalog):
    name, tok = catalog
    texts = [c["text"] * 20 for c in cases(name)]
    want = [tok.encode(t, parse_special=True) for t in texts]
    got: dict[int, list] = {}
    errors = []

    def work(k):
        try:
            got[k] = [tok.encode(t, parse_special=True) for t in texts]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert all(got[k] == want for k in range(4))


@pytest.mark.models
def test_build_from_many_threads_at_once():
    path = store.pull("gemma3:270m")
    text = "<start_of_turn>user\n\n\nhi<end_of_turn>\t\t<unused12>"
    built: list = [None] * 4

    def work(k):
        built[k] = Tokenizer(path)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    want = Tokenizer(path).encode(text, parse_special=True)
    assert all(tok.encode(text, parse_special=True) == want for tok in built)


# ---- synthetic byte-level BPE --------------------------------------------------------------------


def bpe(extra, merges, **kw) -> Tokenizer:
    return Tokenizer.from_bytes(tv.write_gguf(tv.bpe_kv(extra, merges, **kw)))


def ids_of(tok: Tokenizer, *texts: str) -> list[int]:
    """ids of vocabulary strings given in plain text (converted to the byte-level alphabet)."""
    vocab = {tok.token_text(i).decode(): i for i in range(tok.n_vocab)}
    return [vocab[bl(t)] for t in texts]


def test_bpe_merges_lowest_rank_first():
    first_bc = bpe([bl("ab"), bl("bc")], ["b c", "a b"])
    first_ab = bpe([bl("ab"), bl("bc")], ["a b", "b c"])
    assert first_bc.encode("abc", add_special=False) == ids_of(first_bc, "a", "bc")
    assert first_ab.encode("abc", add_special=False) == ids_of(first_ab, "ab", "c")


def test_bpe_merges_leftmost_first_on_equal_rank():
    # "aaa": the pair (a, a) occurs twice with one rank; the left one merges first
    tok = bpe([bl("aa")], ["a a"])
    assert tok.encode("aaa", add_special=False) == ids_of(tok, "aa", "a")
    assert tok.encode("aaaa", add_special=False) == ids_of(tok, "aa", "aa")


def test_bpe_merge_chain_and_words():
    tok = bpe([bl(s) for s in ["he", "ll", "hell", "hello", " w", " wo", " wor", " worl", " world"]],
              [bl("h") + " " + bl("e"), bl("l") + " " + bl("l"), bl("he") + " " + bl("ll"),
               bl("hell") + " " + bl("o"), bl(" ") + " " + bl("w"), bl(" w") + " " + bl("o"),
               bl(" wo") + " " + bl("r"), bl(" wor") + " " + bl("l"), bl(" worl") + " " + bl("d")])
    assert tok.encode("hello world", add_special=False) == ids_of(tok, "hello", " world")
    # the pre-tokenizer keeps words apart: no merge crosses "o" + " "
    assert tok.encode("hello  world", add_special=False) == ids_of(tok, "hello", " ", " world")
    assert tok.decode(tok.encode("hello  world", add_special=False)) == "hello  world"


def test_bpe_byte_level_is_lossless_for_any_bytes_of_utf8():
    tok = bpe([], [])
    text = "ünï 🙂\x00\x7f\r\n\t ＡＢＣ"
    ids = tok.encode(text, add_special=False)
    assert ids == list(text.encode("utf-8"))  # one token per byte: token b is byte b here
    assert tok.decode(ids) == text


def test_bpe_invalid_utf8_input_becomes_replacement_character():
    # llama.cpp decodes the input to code points first: an invalid byte is U+FFFD
    tok = bpe([], [])
    assert tok.encode(b"a\xffb", add_special=False) == tok.encode("a\ufffdb", add_special=False)
    assert tok.encode(b"\xe2\x82", add_special=False) == tok.encode("\ufffd\ufffd", add_special=False)


def test_bpe_ignore_merges_for_llama3():
    # llama-bpe: a word that is a token as a whole is that token, whatever the merges say
    extra = [bl("ab"), bl("abc")]
    merges = ["a b"]  # no merge leads to "abc"
    with_rule = bpe(extra, merges, pre="llama-bpe")
    without = bpe(extra, merges, pre="gpt-2")
    assert with_rule.encode("abc", add_special=False) == ids_of(with_rule, "abc")
    assert without.encode("abc", add_special=False) == ids_of(without, "ab", "c")
    assert with_rule.add_bos  # llama.cpp's default for llama3-style vocabularies
    assert not without.add_bos


@pytest.mark.parametrize("pre, pieces", [
    # merges join adjacent digits, so the pieces show where each pre-tokenizer cut the words
    ("gpt-2", ["x", " ", "12", "34", "56", "7"]),              # ' ?\p{N}+': one word " 1234567"
    ("deepseek-llm", ["x", " ", "12", "34", "56", "7"]),       # \p{N}+ after the space is cut off
    ("llama-bpe", ["x", " ", "12", "3", "45", "6", "7"]),      # \p{N}{1,3}
    ("falcon", ["x", " ", "12", "3", "45", "6", "7"]),         # [0-9][0-9][0-9] after gpt2
    ("default", ["x", " ", "12", "3", "45", "6", "7"]),
    ("qwen2", ["x", " ", "1", "2", "3", "4", "5", "6", "7"]),  # \p{N}
    ("smollm", ["x", " ", "1", "2", "3", "4", "5", "6", "7"]),  # \p{N} first, then gpt2
    ("starcoder", ["x", " ", "1", "2", "3", "4", "5", "6", "7"]),
])
def test_bpe_pre_tokenizers_cut_digits_their_way(pre, pieces):
    digits = "1234567"
    tok = bpe([a + b for a, b in zip(digits, digits[1:])], [f"{a} {b}" for a, b in zip(digits, digits[1:])], pre=pre)
    ids = tok.encode("x 1234567", add_special=False)
    assert [tok.token_to_piece(i).decode() for i in ids] == pieces


def test_bpe_decode_cleans_up_spaces_where_llamacpp_does():
    text = "Hello , world ! It 's me . ' quoted ' x 'll"
    cleaned = bpe([], [], pre="gpt-2")  # clean_up_tokenization_spaces, llama.cpp's default for BPE
    kept = bpe([], [], pre="qwen2")
    # llama_detokenize's three passes: " ," " !" " ." lose the space, " ' " loses both, " 's" too
    assert cleaned.decode(cleaned.encode(text, add_special=False)) == "Hello, world! It's me.'quoted'x 'll"
    assert kept.decode(kept.encode(text, add_special=False)) == text
    # the streamed text is not cleaned up (llama-server streams pieces as they are)
    assert "".join(stream(cleaned, cleaned.encode(text, add_special=False))) == text


def test_bpe_unknown_pre_falls_back_to_gpt2_with_a_warning():
    data = tv.write_gguf(tv.bpe_kv([], [], pre="no-such-pre"))
    with pytest.warns(RuntimeWarning, match="no-such-pre"):
        tok = Tokenizer.from_bytes(data)
    assert "no-such-pre" in tok.warning
    gpt2 = bpe([], [], pre="gpt-2")
    text = "Hello, world! 123 x's"
    assert tok.encode(text) == gpt2.encode(text)


def test_bpe_special_tokens_parse_and_user_defined():
    ctl, user = bl("<|x|>"), bl("<u>")
    tok = bpe([ctl, user], [], types={ctl: TT.CONTROL, user: TT.USER_DEFINED})
    ctl_id, user_id = tok.n_vocab - 2, tok.n_vocab - 1
    assert tok.is_control(ctl_id) and tok.is_special(user_id) and not tok.is_control(user_id)
    assert tok.encode("a<|x|>b", parse_special=True) == [ord("a"), ctl_id, ord("b")]
    assert ctl_id not in tok.encode("a<|x|>b", parse_special=False)
    # user-defined tokens are matched with parse_special off too (as llama.cpp, after HF)
    assert tok.encode("a<u>b", parse_special=False) == [ord("a"), user_id, ord("b")]
    assert tok.decode([ctl_id]) == "<|x|>"
    assert tok.decode([ctl_id], skip_special=True) == ""
    assert tok.token_to_piece(ctl_id, special=False) == b""
    assert tok.token_to_piece(user_id, special=False) == b"<u>"


def test_special_tokens_longest_first_over_the_whole_text():
    # llama.cpp extracts the longest special text everywhere before trying shorter ones: in
    # "wxyz", "xyz" wins over "wx" although "wx" starts first
    wx, xyz = bl("wx"), bl("xyz")
    tok = bpe([wx, xyz], [], types={wx: TT.CONTROL, xyz: TT.CONTROL})
    wx_id, xyz_id = tok.n_vocab - 2, tok.n_vocab - 1
    assert tok.encode("wxyz", parse_special=True) == [ord("w"), xyz_id]
    assert tok.encode("wxwxyz", parse_special=True) == [wx_id, ord("w"), xyz_id]


def llamacpp_partition(text: bytes, specials: list[tuple[bytes, int, bool]], rstrip: bool) -> list[int]:
    """llama.cpp's tokenizer_st_partition, transcribed: each special text in turn, longest
    first, split out of every raw fragment left to right. specials: (text, id, matched) with
    matched False for control tokens when parse_special is off. Raw bytes map to token = byte
    (a byte-level vocabulary without merges)."""
    frags: list[tuple] = [("raw", 0, len(text))] if text else []
    for tok, tid, matched in sorted(specials, key=lambda s: (-len(s[0]), s[1])):
        if not matched:
            continue
        out = []
        for frag in frags:
            if frag[0] != "raw":
                out.append(frag)
                continue
            off, length = frag[1], frag[2]
            while True:
                m = text.find(tok, off, off + length)
                if m < 0:
                    if length > 0:
                        out.append(("raw", off, length))
                    break
                if m > off:
                    out.append(("raw", off, m - off))
                out.append(("tok", tid))
                end = m + len(tok)
                if end >= off + length:
                    break
                length -= end - off
                off = end
                while rstrip and length > 0 and text[off : off + 1].isspace():
                    off += 1
                    length -= 1
        frags = out
    ids = []
    for frag in frags:
        ids += [frag[1]] if frag[0] == "tok" else list(text[frag[1] : frag[1] + frag[2]])
    return ids


SPECIAL_TEXT = st.text(alphabet="ab<>|", min_size=2, max_size=5)


@settings(max_examples=300, deadline=None)
@given(controls=st.lists(SPECIAL_TEXT, max_size=6), users=st.lists(SPECIAL_TEXT, max_size=3),
       text=st.text(alphabet="ab<>| \t", max_size=40), parse_special=st.booleans(), phi3=st.booleans())
def test_special_token_matching_is_llamacpps(controls, users, text, parse_special, phi3):
    names = list(dict.fromkeys(controls + users))  # distinct texts, first role wins
    types = {bl(t): (TT.CONTROL if t in controls else TT.USER_DEFINED) for t in names}
    more = {"general.name": (VT.STRING, "Phi-3 test")} if phi3 else {}
    tok = bpe([bl(t) for t in names], [], types=types, **more)
    specials = [(t.encode(), 256 + k, parse_special or t not in controls) for k, t in enumerate(names)]
    want = llamacpp_partition(text.encode(), specials, rstrip=phi3)
    assert tok.encode(text, add_special=False, parse_special=parse_special) == want


def test_rstrip_special_tokens_of_phi3():
    user = "<|user|>"
    kv = tv.spm_kv([("▁hi", -1.0, TT.NORMAL), ("▁", -2.0, TT.NORMAL), ("h", -3.0, TT.NORMAL), ("i", -3.0, TT.NORMAL),
                    (user, 0.0, TT.CONTROL)], **{"general.name": (VT.STRING, "Phi-3 mini")})
    tok = Tokenizer.from_bytes(tv.write_gguf(kv))
    user_id = tok.n_vocab - 1
    assert tok.token_attr(user_id) & TOKEN_ATTR_RSTRIP
    # the spaces after an RSTRIP token are dropped, and the text after it gets the SPM space
    assert tok.encode(user + "   hi", add_special=False, parse_special=True) == tok.encode(
        user + "hi", add_special=False, parse_special=True)


def test_add_eos_and_bos_from_metadata():
    tok = bpe([bl("<s>"), bl("</s>")], [], types={bl("<s>"): TT.CONTROL, bl("</s>"): TT.CONTROL},
              **{"tokenizer.ggml.bos_token_id": (VT.UINT32, 256), "tokenizer.ggml.eos_token_id": (VT.UINT32, 257),
                 "tokenizer.ggml.add_bos_token": (VT.BOOL, True), "tokenizer.ggml.add_eos_token": (VT.BOOL, True)})
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (256, 257, True, True)
    assert tok.encode("a") == [256, ord("a"), 257]
    assert tok.encode("a", add_special=False) == [ord("a")]
    assert tok.is_eog(257) and not tok.is_eog(256)
    assert tok.decode([256, ord("a"), 257], skip_special=True) == "a"


def test_eot_found_by_text_and_marked_control():
    im_end = bl("<|im_end|>")
    tok = bpe([im_end], [])  # a NORMAL token: llama.cpp makes it a control token
    eot = tok.n_vocab - 1
    assert tok.eot_id == eot
    assert tok.is_control(eot) and tok.is_eog(eot)


# ---- synthetic SentencePiece ------------------------------------------------------------------


def spm(pieces, byte_tokens=True, **kw) -> Tokenizer:
    return Tokenizer.from_bytes(tv.write_gguf(tv.spm_kv(pieces, byte_tokens, **kw)))


def piece_ids(tok: Tokenizer, *texts: str) -> list[int]:
    vocab = {tok.token_text(i).decode(): i for i in range(tok.n_vocab)}
    return [vocab[t] for t in texts]


BASE = [("▁", -10.0, TT.NORMAL), ("a", -10.0, TT.NORMAL), ("b", -10.0, TT.NORMAL)]


def test_spm_highest_score_merges_first():
    a_first = spm(BASE + [("▁a", -1.0, TT.NORMAL), ("ab", -2.0, TT.NORMAL)])
    b_first = spm(BASE + [("▁a", -2.0, TT.NORMAL), ("ab", -1.0, TT.NORMAL)])
    assert a_first.encode("ab", add_special=False) == piece_ids(a_first, "▁a", "b")
    assert b_first.encode("ab", add_special=False) == piece_ids(b_first, "▁", "ab")


def test_spm_space_prefix_and_decode():
    tok = spm(BASE + [("▁a", -1.0, TT.NORMAL)])
    assert tok.add_space_prefix and tok.add_bos  # llama.cpp's defaults for "llama"
    ids = tok.encode("a a")
    assert ids == [tok.bos_id] + piece_ids(tok, "▁a", "▁a")
    assert tok.decode(ids) == "<s> a a"  # after a BOS llama.cpp keeps the space
    assert tok.decode(ids[1:]) == "a a"  # at the start it drops the one it added
    no_prefix = spm(BASE + [("▁a", -1.0, TT.NORMAL)], **{"tokenizer.ggml.add_space_prefix": (VT.BOOL, False)})
    assert no_prefix.encode("a a", add_special=False) == piece_ids(no_prefix, "a", "▁a")
    assert no_prefix.decode(no_prefix.encode("a a", add_special=False)) == "a a"


def test_stream_continuation_keeps_the_leading_space():
    tok = spm(BASE + [("▁a", -1.0, TT.NORMAL)])
    ids = tok.encode("a a", add_special=False)
    assert stream(tok, ids) == ["a", " a", ""]
    assert stream(tok, ids, continuation=True) == [" a", " a", ""]


def test_spm_byte_fallback():
    tok = spm(BASE)
    ids = tok.encode("é", add_special=False)
    assert ids == piece_ids(tok, "▁", "<0xC3>", "<0xA9>")
    assert tok.decode(ids) == "é"
    chunks = stream(tok, ids)
    assert chunks == ["", "", "é", ""]  # the first byte is held until the character is whole


def test_spm_unknown_token_without_byte_fallback():
    tok = spm(BASE, byte_tokens=False)
    assert tok.encode("aéb", add_special=False) == piece_ids(tok, "▁", "a", "<unk>", "b")


def test_spm_special_token_resets_space_prefix():
    tok = spm(BASE + [("▁a", -1.0, TT.NORMAL)])
    s = tok.encode("a</s>a", add_special=False, parse_special=True)
    assert s == piece_ids(tok, "▁a", "</s>", "▁a")  # llama.cpp: text after a special token gets a space too


# ---- streaming ----------------------------------------------------------------------------------


def test_stream_flush_replaces_an_unfinished_character():
    tok = spm(BASE)
    (c3,) = piece_ids(tok, "<0xC3>")
    d = Detokenizer(tok)
    assert d.feed(c3) == ""
    assert d.flush() == REPLACEMENT
    assert d.feed(piece_ids(tok, "a")[0]) == "a"  # a new stream: the leading-space rule again


def test_stream_invalid_sequence_comes_out_as_replacement_at_once():
    tok = spm(BASE)
    c3, a = piece_ids(tok, "<0xC3>", "a")
    d = tok.detokenizer()
    assert d.feed(c3) == ""
    assert d.feed(a) == REPLACEMENT + "a"  # C3 followed by "a" can never complete


# ---- errors -------------------------------------------------------------------------------------


def test_missing_tokens_is_a_format_error():
    kv = tv.bpe_kv([], [])
    del kv["tokenizer.ggml.tokens"]
    with pytest.raises(GGUFError, match="tokenizer.ggml.tokens"):
        Tokenizer.from_bytes(tv.write_gguf(kv))


def test_missing_model_is_a_format_error():
    kv = tv.bpe_kv([], [])
    del kv["tokenizer.ggml.model"]
    with pytest.raises(GGUFError, match="tokenizer.ggml.model"):
        Tokenizer.from_bytes(tv.write_gguf(kv))


def test_unknown_model_is_unsupported():
    kv = tv.bpe_kv([], [])
    kv["tokenizer.ggml.model"] = (VT.STRING, "t5")
    with pytest.raises(UnsupportedError, match="tokenizer.ggml.model.*t5"):
        Tokenizer.from_bytes(tv.write_gguf(kv))


def test_merges_naming_unknown_tokens_are_a_format_error():
    with pytest.raises(GGUFError, match=r"tokenizer.ggml.merges\[1\]"):
        bpe([bl("ab")], ["a b", "ab zz"])
    with pytest.raises(GGUFError, match="tokenizer.ggml.merges"):
        bpe([], ["nospace"])


def test_missing_merges_is_a_format_error():
    kv = tv.bpe_kv([], [])
    del kv["tokenizer.ggml.merges"]
    with pytest.raises(GGUFError, match="tokenizer.ggml.merges"):
        Tokenizer.from_bytes(tv.write_gguf(kv))


def test_scores_of_the_wrong_length_are_a_format_error():
    kv = tv.spm_kv(BASE)
    kv["tokenizer.ggml.scores"] = (VT.ARRAY, [0.0] * 10)
    with pytest.raises(GGUFError, match="tokenizer.ggml.scores"):
        Tokenizer.from_bytes(tv.write_gguf(kv))
    kv = tv.spm_kv(BASE)
    kv["tokenizer.ggml.token_type"] = (VT.ARRAY, [1] * 10)
    with pytest.raises(GGUFError, match="tokenizer.ggml.token_type"):
        Tokenizer.from_bytes(tv.write_gguf(kv))


def test_tokens_of_the_wrong_type_are_a_format_error():
    kv = tv.spm_kv(BASE)
    kv["tokenizer.ggml.tokens"] = (VT.ARRAY, [1, 2, 3])
    with pytest.raises(GGUFError, match="tokenizer.ggml.tokens"):
        Tokenizer.from_bytes(tv.write_gguf(kv))


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nope.gguf"
    with pytest.raises(GGUFError, match="nope.gguf"):
        Tokenizer(path)


def test_out_of_range_ids_are_value_errors():
    tok = spm(BASE)
    for bad in (-1, tok.n_vocab, 2**31, -(2**40)):
        with pytest.raises(ValueError):
            tok.decode([bad])
        with pytest.raises(ValueError):
            tok.token_to_piece(bad)
        with pytest.raises(ValueError):
            tok.detokenizer().feed(bad)


def test_empty_text():
    tok = spm(BASE)
    assert tok.encode("") == [tok.bos_id]
    assert tok.encode("", add_special=False) == []
    assert tok.decode([]) == ""
    assert bpe([], []).encode("") == []


def test_attributes_from_token_types():
    tok = spm(BASE + [("<x>", 0.0, TT.USER_DEFINED)])
    assert tok.token_attr(0) != 0 and not tok.is_control(0)  # <unk> is UNKNOWN
    assert tok.is_control(1) and tok.is_control(2)
    assert tok.token_attr(tok.n_vocab - 1) == TOKEN_ATTR_USER_DEFINED
    assert tok.token_attr(tok.n_vocab - 2) == TOKEN_ATTR_NORMAL
    assert tok.unk_id == 0 and tok.special_id("unk") == 0
    with pytest.raises(ValueError):
        tok.special_id("nope")
    assert TOKEN_ATTR_CONTROL


# ---- plain-text spans (a chat prompt: the messages' text never becomes control tokens) ----------


def _controls(tok):
    return {tok.token_text(i).decode("utf-8", "replace"): i for i in range(tok.n_vocab) if tok.is_control(i)}


def test_plain_text_spans_keep_control_token_text_as_text(catalog):
    name, tok = catalog
    controls = sorted((t for t in _controls(tok) if t), key=len, reverse=True)
    ctl = controls[0]
    text = f"{ctl}head\n{ctl}middle{ctl}\ntail{ctl}"
    i = text.index("middle") - len(ctl)
    j = text.index("\ntail")
    whole = tok.encode(text, False, True)
    spanned = tok.encode(text, False, True, text_spans=[(i, j)])
    ctl_id = _controls(tok)[ctl]
    assert whole.count(ctl_id) == 4 and spanned.count(ctl_id) == 2
    # the span's text is tokenized as text (its control-token text included): the same text
    assert tok.decode(spanned) == text
    # no spans, or spans without control-token text: exactly the usual tokens
    assert tok.encode(text, False, True, text_spans=[]) == whole
    assert tok.encode(text, False, True, text_spans=[(text.index("head"), text.index("head") + 4)]) == whole
    # a control token that would cross a span's end is text too
    k = text.index(ctl)
    crossing = tok.encode(text, False, True, text_spans=[(k + 1, k + 2)])
    assert crossing.count(ctl_id) == 3 and tok.decode(crossing) == text
    # spans on the bytes of a str are characters: non-ASCII text before a span counts once
    t2 = "é🦉 " + ctl
    assert tok.encode(t2, False, True, text_spans=[(3, 3 + len(ctl))]).count(ctl_id) == 0
    assert tok.encode(t2.encode(), False, True, text_spans=[(7, 7 + len(ctl.encode()))]).count(ctl_id) == 0


@pytest.mark.parametrize("spans", [[(5, 3)], [(0, 2), (1, 4)], [(0, 10**6)], [(-1, 2)]])
def test_bad_plain_text_spans_are_a_value_error(catalog, spans):
    _, tok = catalog
    with pytest.raises(ValueError, match="text_spans must be sorted"):
        tok.encode("hello world", True, True, text_spans=spans)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="ab <|>\n_é", max_size=40), st.data())
def test_spans_without_control_text_change_nothing(text, data):
    tok = _smollm2_tokenizer()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    spans = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)]
    if any("<|im_start|>" in text[max(a - 12, 0):b + 12] or "<|im_end|>" in text[max(a - 10, 0):b + 10]
           for a, b in spans):
        return  # spans near control-token text may change it: the other tests
    assert tok.encode(text, True, True, text_spans=spans) == tok.encode(text, True, True)


_SMOLLM2 = []


def _smollm2_tokenizer():
    if not _SMOLLM2:
        _SMOLLM2.append(Tokenizer(store.pull("smollm2:135m")))
    return _SMOLLM2[0]
