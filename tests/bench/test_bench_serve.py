"""benchmarks/bench_serve.py without servers: its arguments, statistics, prompts and tables."""

import importlib.util
import pathlib
import random
import sys

import numpy as np
import pytest

_PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_serve.py"


@pytest.fixture(scope="module")
def bs():
    spec = importlib.util.spec_from_file_location("bench_serve", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_serve"] = mod  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules["bench_serve"]


# --- arguments ------------------------------------------------------------------------------


def test_defaults(bs):
    a = bs.parse_args([])
    assert (a.model, a.parallel, a.threads, a.clients, a.n_predict, a.rounds) == (
        "smollm2:135m", 4, 2, [1, 4, 8], 128, 2)
    assert a.ctx_size == bs.CTX_PER_SLOT * 4  # llama-server splits -c among its slots
    assert a.llama_server == "/tmp/llama-build/bin/llama-server"
    assert a.servers == ["bubo", "llama"] and a.json is None
    assert a.questions == 20


def test_options(bs):
    a = bs.parse_args(["-np", "2", "--clients", "8,1,4,1", "--only", "bubo", "-n", "16", "--rounds", "3",
                       "--json", "out.json", "-t", "4", "--questions", "5"])
    assert a.clients == [1, 4, 8] and a.parallel == 2 and a.ctx_size == bs.CTX_PER_SLOT * 2
    assert a.servers == ["bubo"] and a.n_predict == 16 and a.rounds == 3 and a.threads == 4
    assert str(a.json) == "out.json" and a.questions == 5
    assert bs.parse_args(["-c", "9000"]).ctx_size == 9000
    assert bs.parse_args(["--only", "llama"]).servers == ["llama"]
    # a shared history: each slot's context grows to hold it, the client's sentences and the answer
    h = bs.parse_args(["--history-tokens", "4000"])
    assert h.history_tokens == 4000 and h.ctx_size == 4608 * 4
    assert bs.parse_args([]).history_tokens == 0


@pytest.mark.parametrize("argv", [
    ["--clients", "0"], ["--clients", "1,x"], ["--clients", ""], ["-np", "0"], ["-n", "-5"], ["--rounds", "0"],
    ["--only", "vllm"], ["--questions", "1"], ["--questions", "21"],
    ["-c", "4096", "-np", "4"],  # 1024 tokens a slot cannot hold the ~2000-token prefix test
    ["--history-tokens", "-1"], ["--history-tokens", "8000", "-c", "16384"],  # 4096 a slot cannot hold it
])
def test_bad_arguments_exit_with_usage(bs, argv, capsys):
    with pytest.raises(SystemExit) as e:
        bs.parse_args(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


def test_round_order_alternates(bs):
    assert bs.round_order(0, ["bubo", "llama"]) == ["bubo", "llama"]
    assert bs.round_order(1, ["bubo", "llama"]) == ["llama", "bubo"]
    assert bs.round_order(2, ["bubo", "llama"]) == ["bubo", "llama"]
    assert bs.round_order(1, ["bubo"]) == ["bubo"]


def test_server_commands_share_model_context_threads(bs):
    a = bs.parse_args(["-np", "3", "-t", "2"])
    model = pathlib.Path("/models/m.gguf")
    without = bs.server_command("bubo", a, model, 8001, bubo_np=False)
    with_np = bs.server_command("bubo", a, model, 8001, bubo_np=True)
    llama = bs.server_command("llama", a, model, 8002, bubo_np=False)
    assert without[1:4] == ["-m", "bubo", "serve"] and "-np" not in without
    assert with_np[-2:] == ["-np", "3"]
    assert llama[0] == a.llama_server and llama[-2:] == ["-np", "3"]
    for cmd, port in ((without, 8001), (llama, 8002)):
        flags = dict(zip(cmd, cmd[1:]))
        assert flags["-m"] == str(model) and flags["--host"] == "127.0.0.1" and flags["--port"] == str(port)
        assert flags["-c"] == str(bs.CTX_PER_SLOT * 3) and flags["-t"] == "2"


# --- statistics -----------------------------------------------------------------------------


def test_percentile_matches_numpy(bs):
    rng = random.Random(0)
    for n in (1, 2, 3, 8, 19):
        xs = [rng.uniform(0, 1000) for _ in range(n)]
        for q in (0, 10, 50, 90, 100):
            assert bs.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12)


def test_percentile_refuses_nonsense(bs):
    with pytest.raises(ValueError):
        bs.percentile([], 50)
    with pytest.raises(ValueError):
        bs.percentile([1.0], 101)


def _result(bs, sent, first, end, n, **kw):
    return bs.RequestResult(t_sent=sent, t_first=first, t_end=end, n_tokens=n, **kw)


def test_throughput_summary(bs):
    # two clients sent at 10.0 and 10.5, finished at 12.0 and 14.0: 4 s of wall time
    rs = [_result(bs, 10.0, 10.1, 12.0, 128), _result(bs, 10.5, 10.8, 14.0, 100)]
    s = bs.throughput_summary(rs, n_predict=128)
    assert s["tokens"] == 228 and s["wall_s"] == pytest.approx(4.0)
    assert s["tps"] == pytest.approx(228 / 4.0)
    assert s["ttft_mean_ms"] == pytest.approx(200.0)
    assert s["ttft_p50_ms"] == pytest.approx(200.0)
    assert s["ttft_p90_ms"] == pytest.approx(100 + 0.9 * 200)
    assert s["short"] == 1  # the answer of 100 tokens stopped before n_predict


def test_prefix_summary(bs):
    ttfts = [2.0, 0.10, 0.30, 0.20]
    rs = [_result(bs, 0.0, t, t + 0.05, 8, cached_tokens=c, prompt_tokens=2030)
          for t, c in zip(ttfts, [0, 2020, 2020, 2020])]
    p = bs.prefix_summary(rs)
    assert p["first_ttft_ms"] == pytest.approx(2000.0)
    assert p["rest_ttft_median_ms"] == pytest.approx(200.0)
    assert p["first_over_rest"] == pytest.approx(10.0)
    assert p["cached_tokens"] == [0, 2020, 2020, 2020] and p["prompt_tokens"] == [2030] * 4
    with pytest.raises(ValueError):
        bs.prefix_summary(rs[:1])


def test_median_rounds(bs):
    rounds = [{"tps": 10.0, "short": 0, "cached_tokens": [0, 5]},
              {"tps": 30.0, "short": 1, "cached_tokens": [0, 6]},
              {"tps": 20.0, "short": 1, "cached_tokens": [0, 7]}]
    m = bs.median_rounds(rounds)
    assert m == {"tps": 20.0, "short": 1, "cached_tokens": [0, 5]}
    assert bs.ratio(1.0, 0.0) is None and bs.ratio(None, 2.0) is None and bs.ratio(3.0, 2.0) == 1.5


# --- prompts --------------------------------------------------------------------------------


def test_client_prompts_are_deterministic_and_distinct(bs):
    a = bs.parse_args([])
    seeds = [bs.prompt_seed(r, n, i) for r in range(a.rounds) for n in a.clients for i in range(n)]
    assert len(set(seeds)) == len(seeds)
    prompts = [bs.client_prompt(s) for s in seeds]
    assert len(set(prompts)) == len(prompts)
    assert prompts == [bs.client_prompt(s) for s in seeds]
    for p in prompts:
        sentences = [s for s in p.split(". ") if s]
        assert len(sentences) == 4 and p.endswith(".") and all(s[0].isupper() for s in sentences)


def test_system_prompt_reaches_its_length(bs):
    calls = []

    def count(text):
        calls.append(text)
        return len(text.split())

    text = bs.system_prompt(2000, seed=1, count_tokens=count)
    assert count(text) >= 2000
    # a batch of sentences is at most ~160 words: it stops at the first batch past the target
    assert count(text) < 2000 + 200
    assert len(calls) < 2000 // 50  # counted per batch, not per sentence
    assert text == bs.system_prompt(2000, seed=1, count_tokens=count)
    assert text != bs.system_prompt(2000, seed=2, count_tokens=count)
    assert bs.approx_tokens(text) > 0
    assert len(set(text.split("\n"))) > 10  # varied, not one sentence repeated


def test_questions(bs):
    assert len(bs.QUESTIONS) == 20 and len(set(bs.QUESTIONS)) == 20


# --- the report -----------------------------------------------------------------------------


def _medians(bs, tps1, tps8):
    def tp(tps, p50):
        return {"tokens": 0, "wall_s": 1.0, "tps": tps, "ttft_mean_ms": p50, "ttft_p50_ms": p50,
                "ttft_p90_ms": p50, "short": 0}

    prefix = {"first_ttft_ms": 1000.0, "rest_ttft_median_ms": 100.0, "first_over_rest": 10.0,
              "prompt_tokens": [2030, 2031], "cached_tokens": [0, 2020]}
    return {"throughput": {1: tp(tps1, 100.0), 8: tp(tps8, 400.0)}, "prefix": prefix}


def test_report_ratios(bs):
    a = bs.parse_args(["--clients", "1,8"])
    text = bs.report(a, {"bubo": _medians(bs, 20.0, 20.0), "llama": _medians(bs, 40.0, 120.0)})
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| 8 |")]
    assert len(rows) == 1
    cells = [c.strip(" |") for c in rows[0]]
    # clients, bubo's 6 columns, llama-server's 6, then bubo/llama for tok/s and TTFT p50
    assert cells[1] == "20.0" and cells[6] == "1.00"  # bubo does not scale: 8-client = 1-client
    assert cells[7] == "120.0" and cells[12] == "3.00"
    assert cells[13] == "0.17" and cells[14] == "1.00"
    assert "| bubo | 2030 | 1000 | 100 | 10.0 | 0 | 2020 |" in text


def test_report_one_server_has_no_ratio_columns(bs):
    a = bs.parse_args(["--clients", "1,8", "--only", "bubo"])
    text = bs.report(a, {"bubo": _medians(bs, 20.0, 30.0)})
    assert "bubo/llama" not in text and "llama-server" not in text
    assert "| 8 | 30.0 |" in text and "| 1.50 |" in text
