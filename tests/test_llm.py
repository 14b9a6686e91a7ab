"""Stop strings: for any split of a text into pieces and any stop strings, the streamed text is
exactly the text up to the first stop string to complete, and nothing after it is ever yielded."""

from hypothesis import given, settings
from hypothesis import strategies as st

from bubo.llm import StopMatcher, _text_stream

ALPHABET = "ab\nxé🦉"


def reference(text, stops):
    """The text before the stop string that completes first (the longest on a tie)."""
    stops = sorted({s for s in stops if s}, key=len, reverse=True)
    for end in range(1, len(text) + 1):
        for s in stops:
            if text[:end].endswith(s):
                return text[: end - len(s)], s
    return text, None


@st.composite
def split_text(draw):
    text = draw(st.text(alphabet=ALPHABET, max_size=40))
    cuts = sorted(draw(st.sets(st.integers(0, len(text)), max_size=len(text) + 1)))
    pieces, prev = [], 0
    for c in cuts + [len(text)]:
        pieces.append(text[prev:c])  # empty pieces too: a token may add no text yet
        prev = c
    stops = draw(st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), max_size=3))
    # often take a stop string from the text itself so that stops do occur
    if text and draw(st.booleans()):
        i = draw(st.integers(0, len(text) - 1))
        stops.append(text[i : i + draw(st.integers(1, 4))])
    return text, pieces, stops


class FakeDetok:
    """A scripted token stream: token i is pieces[i]."""

    def __init__(self, pieces):
        self.pieces = pieces
        self.fed = 0

    def feed(self, i):
        self.fed += 1
        return self.pieces[i]

    def flush(self):
        return ""


@settings(max_examples=600, deadline=None)
@given(split_text())
def test_stream_is_text_up_to_first_stop(case):
    text, pieces, stops = case
    want, want_stop = reference(text, stops)
    detok = FakeDetok(pieces)
    matcher = StopMatcher(stops)
    out = list(_text_stream(range(len(pieces)), detok, matcher))
    assert "".join(out) == want
    assert matcher.stopped == want_stop
    assert all(out)  # no empty pieces are yielded
    if want_stop is not None:
        # generation stops pulling tokens as soon as the stop string is complete
        end = len(want) + len(want_stop)
        consumed = len("".join(pieces[: detok.fed]))
        assert consumed - len(pieces[detok.fed - 1]) < end <= consumed


@settings(max_examples=300, deadline=None)
@given(split_text())
def test_every_prefix_of_the_stream_is_safe(case):
    """At no point has the stream shown text that a later stop string would have cut."""
    text, pieces, stops = case
    want, _ = reference(text, stops)
    matcher = StopMatcher(stops)
    shown = ""
    for p in pieces:
        shown += matcher.feed(p)
        assert want.startswith(shown)
    shown += matcher.flush()
    assert shown == want


def test_examples():
    m = StopMatcher(["</s>", "\n\n"])
    assert m.feed("Hello <") == "Hello "
    assert m.feed("/") == ""
    assert m.feed("x") == "</x"
    assert m.feed("\n") == ""
    assert m.feed("\nmore") == ""
    assert m.stopped == "\n\n"
    assert m.feed("late") == "" and m.flush() == ""
    # the first to complete wins, not the first to start
    m = StopMatcher(["abcd", "c"])
    assert m.feed("abcd") == "ab" and m.stopped == "c"
    assert StopMatcher([]).feed("x") == "x"


# --- bubo.Model on a scripted fake native model ------------------------------------------------
# The real tokenizer and file, with bubo._model / bubo._sampler / bubo.sampling replaced by fakes
# that follow the seam API: the "model" always predicts the next token of a script, the sampler
# is argmax. This checks the generation loop itself (cache positions, prefix reuse, EOG,
# max_tokens, stop strings, errors) independently of the native forward pass.

import sys  # noqa: E402
import types  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402


class FakeNative:
    script: list[int] = []
    eog = 2

    def __init__(self, path, n_threads=0, requant=None, n_threads_batch=0):
        from bubo import Tokenizer

        self.n_vocab = Tokenizer(path).n_vocab
        self.hparams = {"n_ctx_train": 8192, "n_vocab": self.n_vocab}
        self.calls = []

    def decode(self, kv, tokens, pos, seq_ids, logits_rows, lora_scales=None):
        assert tokens.dtype == pos.dtype == seq_ids.dtype == np.int32 and logits_rows.dtype == bool
        assert pos[0] == kv.seq_len(0), "pos must continue the sequence"
        assert list(pos) == list(range(pos[0], pos[0] + len(pos)))
        if pos[-1] >= kv.n_ctx:
            raise ValueError("context full")
        self.calls.append(list(tokens))
        kv.tokens[pos[0]:] = list(tokens)
        out = np.zeros((int(logits_rows.sum()), self.n_vocab), dtype=np.float32)
        for row, p in enumerate(pos[logits_rows]):
            nxt = self.script[p + 1] if p + 1 < len(self.script) else self.eog
            out[row, nxt] = 10.0
        return out


class FakeKV:
    """One sequence of tokens, no prefix cache (what the scheduler asks of a cache)."""

    block_size = 32
    sliding_window = 0  # no sliding-window layers: a rollback (speculative decoding) always works
    swa_full = True
    n_seq_max = 1  # one sequence, whatever it is asked for: no contexts

    def __init__(self, model, n_ctx, n_seq_max=1, block_size=32, type="f16", n_batch=512, swa_full=True,
                 type_v=None):
        self.n_ctx = n_ctx
        self.tokens = []

    def seq_last_shared(self, seq):
        return False

    def seq_len(self, seq):
        return len(self.tokens)

    def truncate(self, seq, n):
        del self.tokens[n:]

    def prefix_namespace(self, seq, ns):
        pass

    def free(self, seq):
        self.tokens.clear()

    @property
    def n_free_tokens(self):
        return self.n_ctx - len(self.tokens)

    def grow_bytes(self, seq, n_tokens):
        return 0

    def prefix_attach(self, seq, tokens):
        return 0

    def prefix_register(self, seq, tokens):
        pass


class FakeSampler:
    def __init__(self, n_vocab, params, vocab_pieces=None):
        assert isinstance(params, dict)
        self.accepted = []

    def sample(self, logits, mask=None):
        t = int(np.argmax(logits))
        return t, 0.0, []

    def accept(self, token):
        self.accepted.append(token)


class FakeParams:
    def __init__(self, **kw):
        unknown = set(kw) - {"seed", "temperature", "top_k", "top_p", "min_p", "repeat_penalty"}
        if unknown:
            raise TypeError(f"unexpected keyword {unknown}")
        self.kw = kw

    def to_native(self, n_ctx=None, seed=None):
        assert n_ctx is not None  # -1 windows mean the context size
        return dict(self.kw)


@pytest.fixture
def fake_model(monkeypatch, catalog_model):
    monkeypatch.setitem(sys.modules, "bubo._model", types.SimpleNamespace(Model=FakeNative, KVCache=FakeKV))
    monkeypatch.setitem(sys.modules, "bubo._sampler", types.SimpleNamespace(Sampler=FakeSampler))
    monkeypatch.setitem(sys.modules, "bubo.sampling", types.SimpleNamespace(SamplingParams=FakeParams))
    from bubo.llm import Model

    m = Model(catalog_model("smollm2:135m"), n_ctx=64)

    def script(prompt, continuation):
        p = m.tokenize(prompt)
        FakeNative.script = p + m.tokenize(continuation, add_special=False)
        return p

    return m, script


@pytest.mark.models
def test_generate_streams_the_continuation_until_eog(fake_model):
    m, script = fake_model
    script("The owl", " says: hoo 🦉 hoo!")
    stream = m.generate("The owl")
    with pytest.raises(RuntimeError, match="not finished"):
        stream.completion()
    pieces = list(stream)
    assert "".join(pieces) == " says: hoo 🦉 hoo!"
    assert all(pieces)
    assert stream.completion().text == "".join(pieces)
    assert stream.completion().finish_reason == "stop"
    c = m.complete("The owl")
    assert c.text == " says: hoo 🦉 hoo!" and c.finish_reason == "stop" and c.tokens[-1] == FakeNative.eog
    assert c.prompt_tokens == len(m.tokenize("The owl"))


@pytest.mark.models
def test_stop_string_across_tokens_and_max_tokens(fake_model):
    m, script = fake_model
    script("The owl", " says: hoo hoo, and more")
    c = m.complete("The owl", stop=["o h"])
    assert c.text == " says: ho" and c.finish_reason == "stop" and c.stop == "o h"
    c = m.complete("The owl", max_tokens=2)
    assert c.finish_reason == "length" and len(c.tokens) == 2
    assert c.text == m.detokenize(c.tokens)


@pytest.mark.models
def test_prefix_reuse_decodes_only_the_new_tokens(fake_model):
    m, script = fake_model
    p = script("The owl flew over the", " forest")
    m.complete("The owl flew over the", max_tokens=1)
    m._native.calls.clear()
    q = m.tokenize("The owl flew over the river")
    assert q[: len(p)] == p
    FakeNative.script = q + [FakeNative.eog]
    assert m.complete(q).text == ""
    assert m._native.calls == [q[len(p):]]
    # the same prompt again: only its last token runs (for its logits)
    m._native.calls.clear()
    m.complete(q)
    assert m._native.calls == [q[-1:]]


@pytest.mark.models
def test_context_full_ends_with_length(fake_model):
    m, script = fake_model
    script("The owl", " hoo" * 200)
    c = m.complete("The owl", max_tokens=None)
    assert c.finish_reason == "length"
    assert c.prompt_tokens + len(c.tokens) == m.n_ctx + 1  # the last sampled token needs no slot


@pytest.mark.models
def test_bad_input_is_a_clear_value_error(fake_model):
    m, script = fake_model
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        m.generate("x", max_tokens=0)
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        m.complete("x", max_tokens=-5)
    with pytest.raises(ValueError, match=r"token id 49152 at index 1 is out of range: this model's ids are 0\.\.49151"):
        m.generate([1, 49152])
    with pytest.raises(ValueError, match="token id -1"):
        m.detokenize([-1])
    with pytest.raises(ValueError, match="prompt is 80 tokens but the context holds 64.*larger n_ctx"):
        m.generate([5] * 80)
    with pytest.raises(ValueError, match="prompt is empty"):
        m.generate([])
    with pytest.raises(TypeError, match="unexpected keyword argument .temprature."):
        m.generate("x", temprature=0.5)


@pytest.mark.models
def test_a_second_generation_invalidates_the_first(fake_model):
    m, script = fake_model
    script("The owl", " says hoo hoo hoo hoo")
    first = m.generate("The owl")
    next(first)
    assert m.complete("The owl").text == " says hoo hoo hoo hoo"
    with pytest.raises(RuntimeError, match="another generation started"):
        list(first)


@pytest.mark.models
def test_chat_uses_the_template_and_special_tokens(fake_model):
    m, _ = fake_model
    msgs = [{"role": "user", "content": "Hi"}]
    prompt = m.chat_prompt(msgs)
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = m.tokenize(prompt, parse_special=True)
    FakeNative.script = ids + m.tokenize("Hello!", add_special=False)
    c = m.chat(msgs)
    assert c.text == "Hello!" and c.prompt_tokens == len(ids)
    assert "".join(m.chat_stream(msgs)) == "Hello!"


@pytest.mark.models
def test_a_generation_takes_the_slot_when_first_read(fake_model):
    """Two generations made before either is read each run in full, one after the other."""
    m, script = fake_model
    script("The owl", " says hoo")
    a = m.generate("The owl")
    b = m.generate("The owl", max_tokens=2)
    assert "".join(a) == " says hoo" and a.completion().finish_reason == "stop"
    text = "".join(b)
    c = b.completion()
    assert c.finish_reason == "length" and len(c.tokens) == 2 and text == c.text == m.detokenize(c.tokens)
