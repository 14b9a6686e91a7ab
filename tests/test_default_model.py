"""The default model (bubo.store.DEFAULT_MODEL: what `bubo serve` starts on without -m) answers
plain questions sensibly: benchmarks/default_model.py's factual questions and chat openers, greedy,
each answer right and none looping. docs/benchmarks.md has the same measure of every chat model of
the catalog, which chose it. And the README's terminal examples answer sensibly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import gevent
import pytest

from bubo import store
from bubo.engine.types import FinishEvent, GenerationRequest, TokenEvent
from bubo.sampling import SamplingParams

from engines import start_engine

pytestmark = [pytest.mark.models, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import default_model as dm
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

# what a sensible answer to each of the README's `bubo run MODEL "PROMPT"` examples holds (one of
# the words, lowercased): a README example without an entry here fails the test
README_ANSWERS = {"Why is the sky blue?": ("scatter", "rayleigh", "wavelength")}


def test_the_default_model_answers_plain_questions_sensibly(catalog_model):
    engine = start_engine(catalog_model(store.DEFAULT_MODEL), n_ctx=len(dm.PROMPTS) * 256,
                          n_parallel=len(dm.PROMPTS))  # every prompt at once: one batch (the same tokens)

    def answer(prompt: str) -> tuple[str, str]:
        text = engine.runtime.chat_prompt([{"role": "user", "content": prompt}])
        tokens = engine.tokenizer.encode(text, add_special=True, parse_special=True)
        events = list(engine.submit(GenerationRequest(tokens, SamplingParams(temperature=0), max_tokens=dm.MAX_TOKENS)))
        fin = events[-1]
        assert isinstance(fin, FinishEvent), fin
        return "".join(e.text for e in events if isinstance(e, TokenEvent)).strip(), fin.reason

    try:
        jobs = [gevent.spawn(answer, p) for p in dm.PROMPTS]
        gevent.joinall(jobs, raise_error=True)
    finally:
        engine.stop()
    answers = dm.judge([j.value for j in jobs])
    wrong = [f"{a.prompt!r}: {a.text[:160]!r} ({a.finish})" for a in answers if not a.right]
    assert not wrong, f"{store.DEFAULT_MODEL} answered {len(wrong)} of {len(answers)} wrong:\n" + "\n".join(wrong)


def readme_runs() -> list[tuple[str, str]]:
    """(model, prompt) of each `bubo run MODEL "PROMPT"` line of the README."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r'^bubo run (\S+) "([^"]+)"', text, re.M)


def test_the_readme_terminal_examples_answer_sensibly():
    runs = readme_runs()
    assert runs, "the README shows `bubo run MODEL \"PROMPT\"`"
    for model, prompt in runs:
        assert prompt in README_ANSWERS, f"add what a sensible answer to {prompt!r} holds to README_ANSWERS"
        p = subprocess.run([sys.executable, "-m", "bubo", "run", model, prompt, "-n", "40", "--temp", "0",
                            "-c", "1024"], capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert p.returncode == 0, p.stderr
        low = p.stdout.lower()
        assert any(w in low for w in README_ANSWERS[prompt]) and not dm.loops(p.stdout), (model, prompt, p.stdout)
