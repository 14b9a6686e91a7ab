"""Continuous batching over parallel slots, with a prefix cache shared by every request.

The engine thread calls Scheduler.step() in a loop. One step is one forward pass:

  1. requests whose client went away leave their slot (queued ones never start);
  2. waiting requests take free slots, first come first served; each new one starts from the
     longest run of cached KV blocks its prompt shares with anything run before (any slot, any
     request: the KV cache indexes every full block by its tokens and all tokens before it);
  3. the batch: one row per generating slot (its last sampled token), then prompt chunks of the
     slots still reading their prompt, oldest first, up to the step's token budget (-ub): a long
     prompt is read a chunk per step while the others keep generating;
  4. decode, then sample each slot whose row asked for logits, and send its event.

A task's rows never depend on the rest of the batch: the kernels give every row the same bits
whatever the batch holds (matmul per (row, token) in one summation order, attention per token),
the sampler is the task's own. So an answer is the same alone or beside any others, which also
makes preemption exact: when the KV cache is full, the newest task gives its blocks back and is
queued again at the head, to re-read prompt and answer so far (mostly from the prefix cache) and
go on as if nothing happened.

A task is a list of tokens (the prompt, then each sampled token) and n_past, how many of them
the slot's KV sequence holds. The pending tokens tokens[n_past:] are the slot's work: many while
it reads its prompt, exactly one (the last sampled) while it generates.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Any, Callable

import numpy as np

from bubo.engine.metrics import Histogram
from bubo.engine.types import ErrorEvent, FinishEvent, GenerationRequest, TokenEvent

log = logging.getLogger("bubo.engine")

# llama-server's slot states, as /slots shows them
IDLE, PROCESSING_PROMPT, GENERATING = 0, 2, 4


class Task:
    """One request in flight (queued, in a slot, or preempted and queued again)."""

    def __init__(self, stream: Any, n_vocab: int, n_ctx: int, pieces: Callable[[], list[bytes]], tokenizer: Any,
                 task_id: int, eog_ids: Callable[[], list[int]], vocab: Callable[[], Any]):
        from bubo._sampler import Sampler
        from bubo.llm import StopMatcher

        req: GenerationRequest = stream.request
        self.stream = stream
        self.req = req
        self.id = task_id
        params = req.params if req.params.n_probs == req.n_probs else req.params.replace(n_probs=req.n_probs)
        self.params = params
        if req.ignore_eos:
            bias = dict(params.logit_bias or {})
            bias.update((t, float("-inf")) for t in eog_ids())
            params = params.replace(logit_bias=bias)
        native = params.to_native(n_ctx=n_ctx)
        # DRY's sequence breakers are text: the sampler needs every token's text to match them
        need_pieces = native.get("dry_multiplier", 0) > 0 and native.get("dry_sequence_breakers")
        self.sampler = Sampler(n_vocab, native, pieces() if need_pieces else None)
        self.grammar = None  # the grammar's matcher, and the mask buffer its masks go into
        if req.grammar is not None:
            from bubo._grammar import Matcher

            self.grammar = Matcher(req.grammar, vocab())
            self.mask = np.zeros(n_vocab, dtype=np.uint8)
        self.detok = tokenizer.detokenizer()
        self.matcher = StopMatcher(req.stop)
        self.tokens: list[int] = list(req.prompt)
        self.n_prompt = len(req.prompt)
        self.n_past = 0
        self.n_registered = 0  # leading KV blocks handed to the prefix cache
        self.n_gen = 0
        self.n_cached: int | None = None  # prompt tokens from the prefix cache (first admission)
        self.cache_miss: str | None = None
        self.n_preempted = 0
        self.t_submit = time.perf_counter()
        self.t_admit = 0.0
        self.t_prompt_done = 0.0
        self.t_first_token = 0.0

    @property
    def cancelled(self) -> bool:
        return self.stream.cancelled

    @property
    def n_pending(self) -> int:
        return len(self.tokens) - self.n_past


@dataclasses.dataclass
class Slot:
    id: int
    task: Task | None = None
    admitted: int = 0  # admission order: the newest is preempted first
    last: dict[str, Any] = dataclasses.field(default_factory=dict)  # what /slots shows when idle


class Scheduler:
    """Slots, the wait queue and the step. Only the engine thread calls step(), admit() and
    the private methods; snapshot methods may be called from any thread (stale figures, no
    crash: they read Python objects under the GIL and KV counters that are plain integers)."""

    def __init__(self, model: Any, kv: Any, n_slots: int, n_step: int, n_ctx: int,
                 memory_short: Callable[[int], bool]):
        self.model = model
        self.native = model._native
        self.kv = kv
        self.tokenizer = model.tokenizer
        self.n_vocab = model.n_vocab
        self.n_ctx = n_ctx
        self.n_step = n_step
        self.block_size = kv.block_size
        self.slots = [Slot(i) for i in range(n_slots)]
        self.queue: collections.deque[Task] = collections.deque()
        self._memory_short = memory_short  # bytes the cache must commit -> True if memory is short
        self._n_admitted = 0
        self._eog: list[int] | None = None  # end-of-generation ids, for ignore_eos and grammars
        self._vocab: Any = None  # the grammar masks' byte trie
        self.n_task = 0
        self.counters = dict(
            requests_total=0, prompt_tokens_total=0, prompt_tokens_cached_total=0, prompt_seconds_total=0.0,
            tokens_predicted_total=0, tokens_predicted_seconds_total=0.0, n_decode_total=0,
            n_tokens_max=0, n_busy_slots_total=0, n_preemptions_total=0,
            prefix_cache_lookup_tokens_total=0, prefix_cache_hit_tokens_total=0,
        )
        self.ttft = Histogram()
        self.queue_wait = Histogram()

    # --- the queue (submit runs on other threads; the engine holds the lock around these) ----

    def new_task(self, stream: Any) -> Task:
        self.n_task += 1
        return Task(stream, self.n_vocab, self.n_ctx, self.model._vocab_pieces, self.tokenizer, self.n_task,
                    self._eog_ids, self._grammar_vocab)

    def _grammar_vocab(self) -> Any:
        """The vocabulary's byte trie for grammar masks, built once (the first grammar request)."""
        if self._vocab is None:
            from bubo._grammar import Vocab

            self._vocab = Vocab.from_tokenizer(self.tokenizer)
        return self._vocab

    def _eog_ids(self) -> list[int]:
        if self._eog is None:
            self._eog = [t for t in range(self.n_vocab) if self.tokenizer.is_eog(t)]
        return self._eog

    def n_waiting(self) -> int:
        return sum(1 for t in self.queue if not t.cancelled)

    def idle(self) -> bool:
        return all(s.task is None for s in self.slots) and not self.queue

    # --- one step (engine thread) ---------------------------------------------------------

    def step(self, lock: Any) -> bool:
        """Run one forward pass over every active slot. False when there was nothing to do."""
        for s in self.slots:
            if s.task is not None and s.task.cancelled:
                self._release(s)
        with lock:
            self._admit()
        active = sorted((s for s in self.slots if s.task is not None), key=lambda s: s.admitted)
        if not active:
            return False
        batch = self._plan(active)
        if not batch:
            return True  # everything was preempted or finished for lack of room: plan again
        self._run(batch)
        return True

    def _admit(self) -> None:
        free = [s for s in self.slots if s.task is None]
        while free and self.queue:
            task = self.queue[0]
            if task.cancelled:
                self.queue.popleft()
                continue
            slot = free[0]  # an idle slot's sequence is empty: _release and _preempt free it
            n_hit = 0
            if task.req.cache_prompt:
                # the last known token always runs: its logits (or its row) are what comes next
                n_hit = self.kv.prefix_attach(slot.id, task.tokens[: len(task.tokens) - 1])
            need = len(task.tokens) - n_hit
            if need > self.kv.n_free_tokens and any(s.task is not None for s in self.slots):
                # not enough room now beside the running slots: wait (first come, first served)
                self.kv.free(slot.id)
                return
            self.queue.popleft()
            free.pop(0)
            task.n_past = n_hit
            task.n_registered = n_hit // self.block_size
            self._n_admitted += 1
            slot.admitted = self._n_admitted
            slot.task = task
            now = time.perf_counter()
            if task.n_cached is None:  # first admission (a preempted task keeps its figures)
                task.t_admit = now
                task.n_cached = min(n_hit, task.n_prompt)
                task.cache_miss = self._miss_reason(task, n_hit)
                self.queue_wait.observe(now - task.t_submit)
                c = self.counters
                c["requests_total"] += 1
                c["prompt_tokens_cached_total"] += task.n_cached
                c["prefix_cache_lookup_tokens_total"] += task.n_prompt
                c["prefix_cache_hit_tokens_total"] += task.n_cached

    def _miss_reason(self, task: Task, n_hit: int) -> str | None:
        """Why prompt tokens were computed rather than reused; None when everything that could be
        reused was (all full blocks but the one holding the last prompt token)."""
        if not task.req.cache_prompt:
            return "cache_prompt is false"
        reusable = (task.n_prompt - 1) // self.block_size * self.block_size
        if reusable == 0:
            return f"the prompt is shorter than one cache block ({self.block_size} tokens) plus one"
        if n_hit >= reusable:
            return None
        if n_hit == 0:
            return "no cached block starts this prompt (new prefix, or evicted)"
        return (f"the cache holds the first {n_hit} tokens of this prompt; block {n_hit // self.block_size} "
                "differs from anything cached (or was evicted)")

    def _plan(self, active: list[Slot]) -> list[tuple[Slot, int]]:
        """(slot, tokens to run) for this step: generating slots first, then prompt chunks, oldest
        first, within the step budget and the KV cache's room (preempting the newest if short)."""
        while True:
            budget = self.n_step
            plan: list[tuple[Slot, int]] = []
            for s in active:
                if s.task.n_pending == 1:
                    plan.append((s, 1))
                    budget -= 1
            for s in active:
                n = s.task.n_pending
                if n > 1 and budget > 0:
                    take = min(n, budget)
                    plan.append((s, take))
                    budget -= take
            need = sum(self._new_blocks(s.task, n) for s, n in plan) * self.block_size
            if need <= self.kv.n_free_tokens:
                break
            victim = active[-1]
            if len(active) == 1:
                # alone and still short: the cache cannot hold this sequence
                self._finish_full(victim)
                return []
            self._preempt(victim)
            active = active[:-1]
        short = [(s, n) for s, n in plan if self._memory_short_for(s, n)]
        for s, _ in short:
            self._finish_no_memory(s)
        return [(s, n) for s, n in plan if s.task is not None]

    def _new_blocks(self, task: Task, n: int) -> int:
        bs = self.block_size
        # +1 on a block boundary crossing is exact; a shared partial last block copied on write
        # is not counted here (a fork never happens in the server) and would show as an error
        return -(-(task.n_past + n) // bs) - (-(-task.n_past // bs))

    def _memory_short_for(self, s: Slot, n: int) -> bool:
        """The cache must take more memory from the OS for this slot's rows and the machine is
        short of it now (the memory guard; 0 bytes to commit never asks the OS)."""
        return self._memory_short(self.kv.grow_bytes(s.id, s.task.n_past + n))

    def _run(self, plan: list[tuple[Slot, int]]) -> None:
        n_rows = sum(n for _, n in plan)
        toks = np.empty(n_rows, dtype=np.int32)
        pos = np.empty(n_rows, dtype=np.int32)
        seq = np.empty(n_rows, dtype=np.int32)
        want = np.zeros(n_rows, dtype=bool)
        i = 0
        sampled: list[Slot] = []
        for s, n in plan:
            t = s.task
            toks[i:i + n] = t.tokens[t.n_past:t.n_past + n]
            pos[i:i + n] = np.arange(t.n_past, t.n_past + n, dtype=np.int32)
            seq[i:i + n] = s.id
            if t.n_past + n == len(t.tokens):
                want[i + n - 1] = True
                sampled.append(s)
            i += n
        try:
            logits = self.native.decode(self.kv, toks, pos, seq, want)
        except MemoryError as e:
            log.warning("the KV cache could not grow: %s", e)
            for s, _ in plan:
                self._fail(s, ErrorEvent(503, "insufficient_memory", f"out of memory: {e}"))
            return
        except Exception as e:  # noqa: BLE001 - the batch failed; the engine goes on
            log.exception("decode failed")
            for s, _ in plan:
                self._fail(s, ErrorEvent(500, "internal_error", f"generation failed: {type(e).__name__}: {e}"))
            return
        c = self.counters
        c["n_decode_total"] += 1
        c["n_busy_slots_total"] += len(plan)
        now = time.perf_counter()
        for s, n in plan:
            t = s.task
            t.n_past += n
            if t.n_past <= t.n_prompt:
                c["prompt_tokens_total"] += n
            n_full = t.n_past // self.block_size
            if n_full > t.n_registered:
                self.kv.prefix_register(s.id, t.tokens[: n_full * self.block_size])
                t.n_registered = n_full
        c["n_tokens_max"] = max(c["n_tokens_max"], max(s.task.n_past for s, _ in plan))
        for row, s in enumerate(sampled):
            self._sample(s, logits[row], now)

    def _sample(self, s: Slot, logits: np.ndarray, now: float) -> None:
        t = s.task
        if t.n_gen == 0 and t.t_prompt_done == 0.0:
            t.t_prompt_done = now
            self.counters["prompt_seconds_total"] += now - t.t_admit
        mask = None
        if t.grammar is not None:
            try:
                mask = self._grammar_mask(t)
            except Exception as e:  # noqa: BLE001 - the grammar's state grew past its bounds
                self._fail(s, ErrorEvent(400, "invalid_grammar", f"the grammar cannot go on here: {e}"))
                return
            if not mask.any():
                # nothing can follow and the text is not a sentence of the grammar: a grammar
                # whose language has no continuation here (e.g. a rule that can only recurse)
                self._fail(s, ErrorEvent(400, "invalid_grammar",
                                         "the grammar allows no token after this text and does not accept it as "
                                         "complete: check that every rule can end"))
                return
        token, logprob, top = t.sampler.sample(logits, mask=mask)
        t.sampler.accept(token)
        if t.grammar is not None and not self.tokenizer.is_eog(token):
            t.grammar.accept_token(int(token))
        t.tokens.append(int(token))
        t.n_gen += 1
        req = t.req
        tok = self.tokenizer
        matcher = t.matcher
        reason: str | None = None
        if tok.is_eog(token):
            text = matcher.feed(t.detok.flush()) + matcher.flush()
            reason = "stop"
        else:
            text = matcher.feed(t.detok.feed(token))
            out_of_room = ((req.max_tokens is not None and t.n_gen >= req.max_tokens)
                           or len(t.tokens) - 1 >= self.n_ctx
                           or self._memory_short(self.kv.grow_bytes(s.id, len(t.tokens))))
            if matcher.stopped is None and out_of_room:
                text += matcher.feed(t.detok.flush())
                text += matcher.flush()
                reason = "length"
            if matcher.stopped is not None:
                reason = "stop"
        if t.n_gen == 1:
            t.t_first_token = time.perf_counter()
            self.ttft.observe(t.t_first_token - t.t_submit)
        t.stream._push(TokenEvent(int(token), text, float(logprob), [(int(i), float(p)) for i, p in top]))
        if reason is not None:
            self._finish(s, reason)

    def _grammar_mask(self, t: Task) -> np.ndarray:
        """The tokens that keep t's text in its grammar's language; end-of-generation tokens only
        where the text so far is a whole sentence of it."""
        n = len(t.grammar.vocab)
        t.grammar.mask(out=t.mask[:n])
        eog = self._eog_ids()
        t.mask[eog] = 1 if t.grammar.accepting else 0
        return t.mask

    # --- endings ----------------------------------------------------------------------------

    def _timings(self, t: Task) -> dict[str, Any]:
        end = time.perf_counter()
        prompt_s = max((t.t_prompt_done or end) - t.t_admit, 0.0)
        gen_s = max(end - (t.t_prompt_done or end), 0.0)
        n_prompt = t.n_prompt - (t.n_cached or 0)
        return {
            "cache_n": t.n_cached or 0,
            "prompt_n": n_prompt,
            "prompt_ms": prompt_s * 1e3,
            "prompt_per_token_ms": prompt_s * 1e3 / n_prompt if n_prompt else 0.0,
            "prompt_per_second": n_prompt / prompt_s if n_prompt and prompt_s > 0 else 0.0,
            "predicted_n": t.n_gen,
            "predicted_ms": gen_s * 1e3,
            "predicted_per_token_ms": gen_s * 1e3 / t.n_gen if t.n_gen else 0.0,
            "predicted_per_second": t.n_gen / gen_s if t.n_gen and gen_s > 0 else 0.0,
            "queue_ms": max(t.t_admit - t.t_submit, 0.0) * 1e3,
            "cache_miss": t.cache_miss,
        }

    def _finish(self, s: Slot, reason: str) -> None:
        t = s.task
        timings = self._timings(t)
        c = self.counters
        c["tokens_predicted_total"] += t.n_gen
        c["tokens_predicted_seconds_total"] += timings["predicted_ms"] / 1e3
        t.stream._push(FinishEvent(reason, t.matcher.stopped, t.n_prompt, t.n_cached or 0, t.n_gen, timings))
        self._release(s)

    def _finish_full(self, s: Slot) -> None:
        """The cache cannot hold this sequence's next tokens even alone."""
        t = s.task
        if t.n_gen == 0:
            self._fail(s, ErrorEvent(400, "context_length_exceeded",
                                     f"the prompt ({t.n_prompt} tokens) does not fit in the KV cache "
                                     f"({self.n_ctx} tokens)"))
            return
        # (unreachable while the pool holds n_ctx tokens and sampling stops at n_ctx: kept as the
        # safe ending; text the stop matcher held back for a possible stop string is dropped)
        self._finish(s, "length")

    def _finish_no_memory(self, s: Slot) -> None:
        t = s.task
        if t.n_gen == 0:
            self._fail(s, ErrorEvent(503, "insufficient_memory",
                                     "the KV cache cannot grow: the machine's memory is short; try again"))
        else:
            self._finish_full(s)

    def _fail(self, s: Slot, event: ErrorEvent) -> None:
        s.task.stream._push(event)
        self._release(s)

    def fail_all(self, event: ErrorEvent) -> None:
        """End every task in a slot with event (after an unexpected error in a step)."""
        for s in self.slots:
            if s.task is not None:
                self._fail(s, event)

    def _preempt(self, s: Slot) -> None:
        t = s.task
        log.info("KV cache full: task %d gives back its slot and waits to resume", t.id)
        t.n_preempted += 1
        self.counters["n_preemptions_total"] += 1
        self.kv.free(s.id)
        t.n_past = 0
        t.n_registered = 0
        s.task = None
        self.queue.appendleft(t)

    def _release(self, s: Slot) -> None:
        t = s.task
        s.last = self._slot_view(s, t, processing=False)
        self.kv.free(s.id)  # its indexed blocks stay in the prefix cache
        s.task = None

    # --- introspection (any thread) ---------------------------------------------------------

    def _slot_view(self, s: Slot, t: Task | None, processing: bool) -> dict[str, Any]:
        if t is None:
            return dict(s.last) if s.last else {"id_task": -1, "n_prompt_tokens": 0, "n_prompt_tokens_processed": 0,
                                                "n_prompt_tokens_cache": 0, "n_decoded": 0, "n_remain": -1,
                                                "params": {}}
        req = t.req
        params = dataclasses.asdict(t.params)
        params.update(n_predict=req.max_tokens if req.max_tokens is not None else -1, stop=list(req.stop),
                      cache_prompt=req.cache_prompt)
        return {
            "id_task": t.id,
            "n_prompt_tokens": t.n_prompt,
            "n_prompt_tokens_processed": max(min(t.n_past, t.n_prompt) - (t.n_cached or 0), 0),
            "n_prompt_tokens_cache": t.n_cached or 0,
            "n_decoded": t.n_gen,
            "n_remain": req.max_tokens - t.n_gen if req.max_tokens is not None else -1,
            "params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in params.items()},
        }

    def slot_views(self) -> list[dict[str, Any]]:
        out = []
        for s in self.slots:
            t = s.task
            view = self._slot_view(s, t, t is not None)
            processing = t is not None
            state = IDLE if t is None else (PROCESSING_PROMPT if t.n_gen == 0 else GENERATING)
            out.append({
                "id": s.id,
                "n_ctx": self.n_ctx,
                "is_processing": processing,
                "state": state,
                "id_task": view["id_task"],
                "n_prompt_tokens": view["n_prompt_tokens"],
                "n_prompt_tokens_processed": view["n_prompt_tokens_processed"],
                "n_prompt_tokens_cache": view["n_prompt_tokens_cache"],
                "cache_n": self.kv.seq_len(s.id),
                "params": view["params"],
                "next_token": {"has_next_token": processing, "n_decoded": view["n_decoded"],
                               "n_remain": view["n_remain"]},
            })
        return out
