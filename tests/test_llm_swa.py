"""bubo.Model on a sliding-window model (tiny gemma3, window 8): the cache keeps only the
window's blocks for the local layers, so a repeated or extended prompt whose shared prefix
reaches back past the window cannot be resumed from the cache; the model starts the prompt over,
and the answer is the same as the first time."""
import bubo

from engines import THREADS
from reference.tiny import write_tiny_model

PROMPT = ("The quick brown fox jumps over the lazy dog, and the dog sleeps in the sun while "
          "the fox runs home to the old house by the river.")


def test_repeated_prompt_on_a_windowed_cache(tmp_path):
    path = write_tiny_model(tmp_path / "gemma3.gguf", "gemma3", types="F32", sliding_window=8)
    m = bubo.Model(path, n_ctx=256, n_threads=THREADS)
    assert not m._kv.swa_full and m._kv.sliding_window == 8
    first = m.complete(PROMPT, max_tokens=12, temperature=0)
    again = m.complete(PROMPT, max_tokens=12, temperature=0)
    longer = m.complete(PROMPT + " The", max_tokens=12, temperature=0)
    assert again.tokens == first.tokens and again.text == first.text
    fresh = bubo.Model(path, n_ctx=256, n_threads=THREADS).complete(PROMPT + " The", max_tokens=12, temperature=0)
    assert longer.tokens == fresh.tokens
    # the window pool stays bounded however long the sequence grew
    assert m._kv.blocks_in_use(True) < m._kv.blocks_in_use(False)
