"""Which catalog model should `bubo serve` and `bubo run` start on? The one that answers plain
questions sensibly: factual questions whose answer is one word or number, and chat openers whose
answer must end on its own, without looping. Every prompt greedy (temperature 0), as a first
user's tries are; the same prompts are tests/test_default_model.py's check of the default.

    python benchmarks/default_model.py [MODEL ...] [--save]   (default: every chat model of the catalog)

Prints one row per model: answers right, answers that loop, the download's size, seconds for all
the answers one after another, and the answers themselves with -v."""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass

# (question, the words one of which a right answer holds, lowercased)
FACTS: list[tuple[str, tuple[str, ...]]] = [
    ("What is the capital of France?", ("paris",)),
    ("What is the capital of Japan?", ("tokyo",)),
    ("How many days are there in a week?", ("7", "seven")),
    ("What is 12 times 12?", ("144",)),
    ("Who wrote Romeo and Juliet?", ("shakespeare",)),
    ("What is the largest planet in our solar system?", ("jupiter",)),
    ("At what temperature in Celsius does water boil at sea level?", ("100",)),
    ("How do you say 'thank you' in French?", ("merci",)),
    ("What gas do plants take in from the air to make their food?", ("carbon dioxide", "co2", "co₂")),
    ("How many legs does a spider have?", ("8", "eight")),
]
# chat openers: the answer must end (the model's end of turn) within MAX_TOKENS, without a loop
CHATS = ["Hello! How are you today?", "Tell me a fun fact about owls.", "Give me one tip for sleeping better."]
PROMPTS = [q for q, _ in FACTS] + CHATS  # one user message each
MAX_TOKENS = 96


@dataclass
class Answer:
    prompt: str
    text: str
    finish: str
    right: bool


def loops(text: str, n: int = 4, times: int = 3) -> bool:
    """True when some run of n words comes back `times` times or more (a degenerate repetition)."""
    words = re.findall(r"\w+", text.lower())
    seen: dict[tuple[str, ...], int] = {}
    for i in range(len(words) - n + 1):
        key = tuple(words[i:i + n])
        seen[key] = seen.get(key, 0) + 1
        if seen[key] >= times:
            return True
    return False


def ask(model: object) -> list[tuple[str, str]]:
    """(text, finish reason) of each of PROMPTS' greedy answers, from a bubo.Model."""
    out = []
    for p in PROMPTS:
        c = model.chat([{"role": "user", "content": p}], max_tokens=MAX_TOKENS, temperature=0)  # type: ignore[attr-defined]
        out.append((c.text, c.finish_reason))
    return out


def judge(got: list[tuple[str, str]]) -> list[Answer]:
    """Each of PROMPTS' answers ((text, finish reason) in order) and whether it is right: a fact
    that holds one of its words and does not loop; a chat answer that ends on its own and does not loop."""
    answers = []
    for (q, words), (text, finish) in zip(FACTS, got):
        low = text.lower()
        answers.append(Answer(q, text, finish, any(w in low for w in words) and not loops(text)))
    for q, (text, finish) in zip(CHATS, got[len(FACTS):]):
        answers.append(Answer(q, text, finish, finish == "stop" and bool(text.strip()) and not loops(text)))
    return answers


def main() -> int:
    import results

    import bubo
    from bubo import store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="catalog names (default: every chat model of the catalog)")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-v", "--verbose", action="store_true", help="print every answer (after the table)")
    ap.add_argument("--save", action="store_true", help="also write the table to benchmarks/results/default_model/")
    args = ap.parse_args()
    names = args.models or ["smollm2:135m", "qwen2.5-coder:0.5b", "qwen2.5-coder:1.5b"]
    rows, said = [], []
    for name in names:
        with bubo.Model(store.pull(name), n_ctx=1024, n_threads=args.threads) as m:
            t0 = time.monotonic()
            answers = judge(ask(m))
            took = time.monotonic() - t0
        right = sum(a.right for a in answers)
        looping = sum(loops(a.text) for a in answers)
        rows.append(f"| {name} | {right}/{len(answers)} | {looping} | {store.CATALOG[name].size / 1e6:.0f} MB | "
                    f"{took:.1f} |")
        said += [f"{name}: {'ok ' if a.right else 'BAD'} {a.prompt!r}: {a.text.strip()[:160]!r} ({a.finish})"
                 for a in answers]
    with results.saving("default_model", args.save):
        threads = args.threads or bubo.cpus.usable()
        print(f"### {len(FACTS)} factual questions and {len(CHATS)} chat openers, greedy, {threads} threads\n")
        print("| model | right | loops | download | seconds |\n| --- | ---: | ---: | ---: | ---: |")
        print("\n".join(rows))
    if args.verbose:
        print("\n" + "\n".join(said))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
