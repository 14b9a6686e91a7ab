"""The grammar of an answer's reasoning: where a <think> block may stand, and where it must be
closed, around the answer's own constraint (a response_format, a GBNF grammar, a forced call).

Thinking off means no reasoning in the answer. The template is rendered with thinking disabled
(dialect.thinking_of); that is a request the model may ignore, so the answer's grammar holds it
too: a think block the prompt left open is closed at once, and one the model opens is closed
right after it opens (an empty block, which the parser drops). Thinking on leaves the reasoning
free; only where the answer has a constraint of its own does the grammar say where the reasoning
ends and the constrained part starts (a JSON object after the reasoning, not inside it).

Which cases hold, with T = the template thinks (its source writes <think>), I = the prompt ends
inside an open <think> (the template or the request's prefill opened it), B = the answer's own
constraint:

    thinking on,  I:          reasoning  </think>  B              (no B: no grammar)
    thinking on,  not I, T:   [<think> reasoning </think>]  B     (no B: no grammar)
    thinking off, I:          </think>  (B or free text)
    thinking off, not I, T:   [<think></think>]  (B or free text)
    otherwise:                B as it is

"free text" is any text that does not begin, after white space, with <think>; later in the
answer the tag is content like any other text (the parser reads a think block only at the
start).
"""

from __future__ import annotations

from bubo.chat.parsers import THINK_CLOSE, THINK_OPEN
from bubo.chat.schema import literal
from bubo.chat.tools import prefix_rules, text_without

GAP = '"\\n"{0,2}'  # between </think> and the answer, as templates write it


def template_thinks(template_source: str | None) -> bool:
    """True when a chat template teaches its model <think> blocks (Qwen3, DeepSeek-R1, ...)."""
    return THINK_OPEN in (template_source or "")


def free_text(rule: str) -> list[str]:
    """Rules whose sentences (from `rule`) are the texts that do not begin, after white space,
    with <think>: white space, then an automaton over the tag's characters that may stop or
    leave it at any character but the tag's last."""
    ws = "[ \\t\\n\\r]"
    rules = [f"{rule} ::= {ws}* {rule}-0", f"{rule}-any ::= [^\\x00]*"]
    for k, c in enumerate(THINK_OPEN):
        nxt = f" | {literal(c)} {rule}-{k + 1}" if k + 1 < len(THINK_OPEN) else ""
        other = f"[^{c} \\t\\n\\r]" if k == 0 else f"[^{c}]"
        rules.append(f"{rule}-{k} ::= ({other} {rule}-any{nxt})?")
    return rules


def answer_grammar(body: str | None, root: str = "root", *, thinking: bool, in_think: bool,
                   thinks: bool) -> str | None:
    """GBNF for the whole answer, or None when `body` (GBNF whose start rule is `root`; None: no
    constraint) stands as it is. thinking: reasoning is on; in_think: the prompt ends inside an
    open <think>; thinks: the template thinks (template_thinks). See the module's table."""
    rules: list[str] = []
    if thinking:
        if body is None:
            return None
        if in_think:
            head = f"think-0 {literal(THINK_CLOSE)} {GAP}"
        elif thinks:
            head = f"({literal(THINK_OPEN)} think-0 {literal(THINK_CLOSE)} {GAP})?"
        else:
            return None
        rules += text_without(THINK_CLOSE, "think")
    else:
        if in_think:
            head = f"{literal(THINK_CLOSE)} {GAP}"
        elif thinks:
            head = f"({literal(THINK_OPEN + THINK_CLOSE)} {GAP})?"
        else:
            return None
    if body is None:
        rules += free_text("free")
        tail = "free"
    else:
        rules.append(prefix_rules(body, "a-"))
        tail = "a-" + root
    return f"root ::= {head} {tail}\n" + "\n".join(rules) + "\n"
