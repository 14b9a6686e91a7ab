"""The generation core: one request's logits in, its events out.

A Generation owns what turns a row of logits into the next TokenEvent: the sampler chain (with
the request's seed), the grammar matcher and its token mask, the streaming detokenizer, the stop
matcher, and the finish rules (end-of-generation token, stop string, max_tokens, a full context,
memory that is short). The scheduler makes one per request; the library's bubo.Model is a
one-slot client of the same scheduler, so the library and the server run this code alike.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from bubo.engine.types import EngineRefusal, GenerationRequest, NoTokenError, Reason, TokenEvent

if TYPE_CHECKING:
    from bubo._grammar import Matcher
    from bubo.engine.fit import Fit
    from bubo.runtime import Runtime

RESAMPLES_BEFORE_PLAN = 3  # sampled tokens refused (they leave no room to finish) before steering
STOP = "stop"  # an end-of-generation token or a stop string
LENGTH = "length"  # max_tokens, a full context, or memory that is short


class StopMatcher:
    """Cuts a text stream at the first stop string, even one spread over several pieces.

    feed() returns the text that is safe to show: it holds back the longest tail of what it has
    seen that could still become a stop string. A stop string "completes" at the position of its
    last character; the first one to complete wins (the longest one on a tie), wherever the
    piece boundaries fall, and nothing from its first character on is ever returned.

    The stop strings are one Aho-Corasick automaton: each character of the answer moves it one
    state (amortised), whatever the number of stop strings, so matching them costs the engine
    thread the same per token for one stop string or bubo.limits.MAX_STOP."""

    def __init__(self, stop: Iterable[str] = ()):
        self.stop = sorted({s for s in stop if s}, key=len, reverse=True)
        self._held = ""
        self._state = 0
        self.stopped: str | None = None  # the stop string that ended the stream
        # the trie of the stop strings: goto[state][char], the state's depth (its text's length),
        # the failure link (the longest proper suffix of its text that is a trie state), and the
        # longest stop string that ends its text (itself, or found through the failure links)
        self._goto: list[dict[str, int]] = [{}]
        self._depth = [0]
        self._fail = [0]
        self._ends: list[str | None] = [None]
        for word in self.stop:
            state = 0
            for ch in word:
                nxt = self._goto[state].get(ch)
                if nxt is None:
                    nxt = len(self._goto)
                    self._goto[state][ch] = nxt
                    self._goto.append({})
                    self._depth.append(self._depth[state] + 1)
                    self._fail.append(0)
                    self._ends.append(None)
                state = nxt
            if self._ends[state] is None:  # longest first: a state's own word is its longest end
                self._ends[state] = word
        queue = collections.deque(self._goto[0].values())
        while queue:
            state = queue.popleft()
            for ch, nxt in self._goto[state].items():
                f = self._fail[state]
                while f and ch not in self._goto[f]:
                    f = self._fail[f]
                self._fail[nxt] = self._goto[f].get(ch, 0) if self._goto[f].get(ch, 0) != nxt else 0
                if self._ends[nxt] is None:
                    self._ends[nxt] = self._ends[self._fail[nxt]]
                queue.append(nxt)

    def feed(self, text: str) -> str:
        if self.stopped is not None:
            return ""
        buf = self._held + text
        base = len(self._held)
        state, goto, fail, ends = self._state, self._goto, self._fail, self._ends
        for i, ch in enumerate(text):
            while state and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, 0)
            word = ends[state]
            if word is not None:
                self.stopped = word
                self._held, self._state = "", 0
                return buf[: base + i + 1 - len(word)]
        self._state = state
        hold = self._depth[state]
        self._held = buf[len(buf) - hold:] if hold else ""
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        """The stream ended without a stop string: the held-back tail is plain text."""
        out, self._held, self._state = ("" if self.stopped is not None else self._held), "", 0
        return out


class Detok(Protocol):
    def feed(self, id: int) -> str: ...
    def flush(self) -> str: ...


class TextOut:
    """Tokens to the text a client may see: whole UTF-8 characters (the detokenizer), cut at the
    first stop string (the StopMatcher)."""

    def __init__(self, detok: Detok, stops: StopMatcher):
        self.detok = detok
        self.stops = stops

    @property
    def stopped(self) -> str | None:
        return self.stops.stopped

    def token(self, token: int) -> str:
        return self.stops.feed(self.detok.feed(token))

    def end(self) -> str:
        """The stream ends here: what the detokenizer and the stop matcher held back."""
        return self.stops.feed(self.detok.flush()) + self.stops.flush()


def text_pieces(tokens: Iterable[int], detok: Detok, stops: StopMatcher) -> Iterator[str]:
    """A token stream as the text pieces a Generation sends (empty pieces left out): stops
    pulling tokens at the one that completes a stop string."""
    out = TextOut(detok, stops)
    for tok in tokens:
        piece = out.token(tok)
        if piece:
            yield piece
        if out.stopped is not None:
            return
    piece = out.end()
    if piece:
        yield piece


class GrammarRefused(EngineRefusal, ValueError):
    """A grammar the matcher cannot start on (too ambiguous from its first step)."""

    reason = Reason.GRAMMAR_STUCK


class GrammarStuck(Exception):
    """The grammar allows no token after this text (and does not accept it whole), or its state
    outgrew its bounds."""


class NoTokenLeft(Exception):
    """The request's logit_bias bans every token its grammar allows at this point of the answer:
    that request cannot go on (the others are not concerned)."""


class Generation:
    """One request's sampling and output state. n_ctx: the most tokens its sequence may hold."""

    def __init__(self, runtime: Runtime, req: GenerationRequest, n_ctx: int):
        from bubo._sampler import Sampler

        self.runtime = runtime
        self.req = req
        self.n_ctx = n_ctx
        native: dict[str, Any] = req.params.to_native(n_ctx=n_ctx)
        if req.n_probs != native.get("n_probs", 0):
            native["n_probs"] = req.n_probs
        if req.ignore_eos:
            bias = dict(native.get("logit_bias") or {})
            bias.update((t, float("-inf")) for t in runtime.eog_ids())
            native["logit_bias"] = bias
        # DRY's sequence breakers are text: the sampler needs every token's text to match them
        pieces = runtime.vocab_pieces() if req.params.matches_token_text else None
        self.sampler = Sampler(runtime.n_vocab, native, pieces)
        self.grammar: Matcher | None = None
        self._mask: npt.NDArray[np.uint8] | None = None
        if req.grammar is not None:
            from bubo._grammar import Matcher
            from bubo.errors import UnsupportedError

            try:
                self.grammar = Matcher(req.grammar, runtime.grammar_vocab())
            except (ValueError, UnsupportedError) as e:
                raise GrammarRefused(f"the grammar cannot be followed: {e}") from None
            self._mask = np.zeros(runtime.n_vocab, dtype=np.uint8)
        # the tokens the request bans (false or -inf in logit_bias; end-of-generation ones with ignore_eos)
        self._banned = np.array(sorted(t for t, b in native.get("logit_bias", {}).items()
                                       if b == float("-inf") and 0 <= t < runtime.n_vocab), dtype=np.int64)
        # a grammar-constrained answer is steered to end within its budget (bubo.engine.fit)
        self.fit: Fit | None = None
        if self.grammar is not None and not req.ignore_eos:
            from bubo.engine.fit import Fit

            self.fit = Fit(runtime.piece_index(), runtime.eog_ids())
        self.text = TextOut(runtime.tokenizer.detokenizer(), StopMatcher(req.stop))
        self.n_gen = 0
        if len(self._banned) and self._nothing_allowed():
            raise NoTokenError(self._no_token_message())

    def _nothing_allowed(self) -> bool:
        """Whether the request's bans leave no token the grammar (or the vocabulary) allows now."""
        if not len(self._banned):
            return False
        try:
            allowed = self._grammar_mask().astype(bool) if self.grammar is not None else \
                np.ones(self.runtime.n_vocab, dtype=bool)
        except GrammarStuck:
            return False  # the grammar's own failure, reported as such
        allowed[self._banned] = False
        return not allowed.any()

    def _no_token_message(self) -> str:
        where = ("to start the answer" if self.n_gen == 0
                 else f"after {self.n_gen} generated token{'s' if self.n_gen > 1 else ''}")
        what = "the grammar allows" if self.grammar is not None else "the vocabulary holds"
        return (f"logit_bias bans every token {what} {where} ({len(self._banned)} tokens banned): "
                "nothing can be generated; ban fewer tokens")

    @property
    def stop_string(self) -> str | None:
        return self.text.stopped

    @property
    def steered(self) -> bool:
        """The grammar steered the answer to a short ending, to fit its budget."""
        return self.fit is not None and self.fit.steered

    def _left(self, n_seq: int) -> int:
        """The tokens this answer may still have, this one included: max_tokens' and the
        context's bound, whichever is nearer."""
        left = self.n_ctx - n_seq + 2
        if self.req.max_tokens is not None:
            left = min(left, self.req.max_tokens - self.n_gen)
        return left

    def step(self, logits: npt.NDArray[np.float32], n_seq: int,
             room: Callable[[int], bool] | None = None) -> tuple[TokenEvent, str | None]:
        """Sample the next token: (its event, the finish reason or None to go on). n_seq: the
        tokens the sequence holds once this one is appended; room(n): whether memory lets the
        cache hold n tokens (asked only while nothing else ends the answer). GrammarStuck when
        the grammar cannot go on, NoTokenLeft when the request's bans leave no token."""
        mask = self._grammar_mask() if self.grammar is not None else None
        try:
            if self.fit is not None and mask is not None:
                token, logprob, top = self._sample_fitting(logits, mask, max(self._left(n_seq), 1))
            else:
                token, logprob, top = self.sampler.sample(logits, mask=mask)
        except ValueError as e:  # the native sampler found no token it may pick: this request's input
            raise NoTokenLeft(self._no_token_message() if self._nothing_allowed() else str(e)) from None
        self.sampler.accept(token)
        tok = self.runtime.tokenizer
        eog = tok.is_eog(token)
        if self.grammar is not None and not eog:
            self.grammar.accept_token(int(token))
        self.n_gen += 1
        out = self.text
        reason: str | None = None
        if eog:
            text = out.end()
            reason = STOP
        else:
            text = out.token(token)
            max_tokens = self.req.max_tokens
            full = ((max_tokens is not None and self.n_gen >= max_tokens) or n_seq - 1 >= self.n_ctx
                    or (room is not None and not room(n_seq)))
            if out.stopped is None and full:
                text += out.end()
                reason = LENGTH
            if out.stopped is not None:
                reason = STOP
        return TokenEvent(int(token), text, float(logprob), [(int(i), float(p)) for i, p in top],
                          self._logprobs_of(logits)), reason

    def _logprobs_of(self, logits: npt.NDArray[np.float32]) -> tuple[float, ...]:
        """The request's probs_of tokens' log-probabilities under the raw logits (log-softmax in
        float64, as n_probs' alternatives are without a bias or temperature)."""
        ids = self.req.probs_of
        if not ids:
            return ()
        row = logits.astype(np.float64)
        top = float(row.max())
        lse = top + float(np.log(np.exp(row - top).sum()))
        return tuple(float(row[i]) - lse for i in ids)

    def _sample_fitting(self, logits: npt.NDArray[np.float32], mask: npt.NDArray[np.uint8],
                        left: int) -> tuple[int, float, list[tuple[int, float]]]:
        """Sample a token after which the answer can still end within `left` tokens (this one
        included), steering to the grammar's shortest completion when the model's choices
        cannot (bubo.engine.fit)."""
        fit, g, tok = self.fit, self.grammar, self.runtime.tokenizer
        assert fit is not None and g is not None
        if fit.plan is None:
            for _ in range(RESAMPLES_BEFORE_PLAN):
                token, logprob, top = self.sampler.sample(logits, mask=mask)
                if tok.is_eog(token):
                    return token, logprob, top
                after = g.clone()
                if after.accept_token(int(token)) and fit.fits(after, left - 1):
                    return token, logprob, top
                fit.steered = True
                mask[token] = 0
                if not mask.any():
                    break
            fit.steered = True
        cands = fit.candidates(g, left)
        if not cands:  # nothing finishes the text: the grammar's own mask, as without a budget
            return self.sampler.sample(logits, mask=self._grammar_mask())
        token, logprob, top = self.sampler.sample(logits, mask=cands)
        if not tok.is_eog(token):
            fit.took(self.runtime.grammar_pieces()[token])
        return token, logprob, top

    def _grammar_mask(self) -> npt.NDArray[np.uint8]:
        """The tokens that keep the text in the grammar's language; end-of-generation tokens only
        where the text so far is a whole sentence of it."""
        g, mask = self.grammar, self._mask
        assert g is not None and mask is not None
        try:
            n = len(g.vocab) if g.vocab is not None else 0
            g.mask(out=mask[:n])
        except Exception as e:  # noqa: BLE001 - the grammar's state grew past its bounds
            raise GrammarStuck(f"the grammar cannot go on here: {e}") from None
        mask[self.runtime.eog_ids()] = 1 if g.accepting else 0
        if not mask.any():
            # nothing can follow and the text is not a sentence of the grammar: a grammar whose
            # language has no continuation here (e.g. a rule that can only recurse)
            raise GrammarStuck("the grammar allows no token after this text and does not accept it as "
                               "complete: check that every rule can end")
        return mask
