"""An encoder's engine thread (all-minilm:l6-v2): jobs queued together share passes and give the
vectors of one by one; a job whose reader went away is dropped; stop() fails what is queued at
once and what runs at its next pass; generation is refused."""

from __future__ import annotations

import gevent
import numpy as np
import pytest

from bubo import embed as embedding
from bubo.engine import GenerationRequest, NotReadyError
from bubo.engine.engine import EMBED_BATCH_TOKENS

from engines import start_engine

pytestmark = pytest.mark.models

TEXTS = ["The cat sat on the mat.", "Interest rates rose again.", "東京は日本の首都です。", ""]


@pytest.fixture(scope="module")
def engine(minilm_gguf):
    e = start_engine(minilm_gguf, embedding=True)
    yield e
    e.stop()


def _seqs(e, texts):
    assert e.runtime is not None
    return embedding.tokenize(e.runtime, texts, 512)[0]


def test_jobs_queued_together_give_the_vectors_of_one_by_one(engine):
    seqs = _seqs(engine, TEXTS)
    alone = [engine.embed([s]).result()[0] for s in seqs]
    jobs = [engine.embed([s], normalize=i % 2 == 0) for i, s in enumerate(seqs)]  # queued while the first runs
    got = [j.result()[0] for j in jobs]
    for i, (a, g) in enumerate(zip(alone, got)):
        if i % 2 == 0:
            np.testing.assert_array_equal(g, a)  # batch invariance: the same bits
        else:  # not normalised: the raw vector, whose direction is the normalised one
            assert abs(np.linalg.norm(g) - 1) > 1e-3
            np.testing.assert_allclose(g / np.linalg.norm(g), a, atol=1e-7)
    assert engine.idle


def test_clients_in_step_share_passes_and_get_their_own_vectors(engine, monkeypatch):
    """Four clients each sending one input at a time (each after a moment's work on its answer, as
    an HTTP client's round trip), the thread lingering for them (test_embed_linger.py): passes
    carry several clients' inputs, every input is embedded once, and every vector is the one its
    input gets alone."""
    texts = [f"Sentence number {i} about {topic}." for i, topic in enumerate(["cats", "rain", "tea", "maps"] * 6)]
    seqs = _seqs(engine, texts)
    alone = [engine.embed([s]).result()[0] for s in seqs]
    sizes: list[int] = []
    run = engine._run_jobs
    monkeypatch.setattr(engine, "_run_jobs", lambda jobs: (sizes.append(len(jobs)), run(jobs))[1])

    def client(k: int) -> None:
        for i in range(k, len(seqs), 4):
            np.testing.assert_array_equal(engine.embed([seqs[i]]).result()[0], alone[i])
            gevent.sleep(0.0003 * (k + 1))  # the client reads its answer and sends the next

    gevent.joinall([gevent.spawn(client, k) for k in range(4)], raise_error=True)
    assert sum(sizes) == len(seqs) and max(sizes) > 1


def test_a_large_job_runs_in_passes_and_is_exact(engine):
    seqs = _seqs(engine, ["word " * 500] * 12 + TEXTS)  # more than EMBED_BATCH_TOKENS tokens
    assert sum(map(len, seqs)) > EMBED_BATCH_TOKENS
    big = engine.embed(seqs).result()
    np.testing.assert_array_equal(big[-4:], engine.embed(seqs[-4:]).result())
    np.testing.assert_array_equal(big[0], big[11])


def test_an_abandoned_job_is_dropped(engine):
    seqs = _seqs(engine, ["word " * 500] * 40)  # several passes
    job = engine.embed(seqs)
    reader = gevent.spawn(job.result)
    gevent.sleep(0.05)
    reader.kill()  # the client went away
    assert job.cancelled
    with gevent.Timeout(20):  # dropped at its next pass, not after all 40 inputs
        while not engine.idle:
            gevent.sleep(0.01)
    assert engine.embed(_seqs(engine, ["still serving"])).result().shape == (1, 384)


def test_generation_is_refused(engine):
    with pytest.raises(embedding.EncoderOnlyError, match="embedding model"):
        engine.submit(GenerationRequest([101, 102]))


def test_stop_fails_the_queued_jobs(minilm_gguf):
    e = start_engine(minilm_gguf)
    seqs = _seqs(e, ["word " * 500] * 40)
    running = e.embed(seqs)
    queued = e.embed(seqs[:1])
    gevent.sleep(0.05)
    e.stop()
    with pytest.raises(NotReadyError):
        queued.result()
    with pytest.raises(NotReadyError), gevent.Timeout(20):
        running.result()  # ended at its next pass
    with pytest.raises(NotReadyError, match="unloaded"):
        e.embed(seqs[:1])
    with gevent.Timeout(20):
        while not e.stopped:
            gevent.sleep(0.01)
    assert e.idle
