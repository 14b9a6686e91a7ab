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
