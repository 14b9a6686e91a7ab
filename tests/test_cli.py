"""The command line, run as users run it: a subprocess, exit codes, stdout and stderr."""

import os
import subprocess
import sys

import pytest

from bubo import store
from bubo.cli.bench import markdown_table


def bubo(*args, env=None, home=None):
    e = dict(os.environ)
    e = {k: v for k, v in e.items() if not k.startswith("BUBO_ARG_")}
    e["SKBUILD_EDITABLE_VERBOSE"] = "0"  # an editable install would report its rebuild on stdout
    if home is not None:
        e["BUBO_HOME"] = str(home)
    e.update(env or {})
    # stdin /dev/null: `bubo run` reads a piped stdin as its prompt, and must not wait on the test's own
    return subprocess.run([sys.executable, "-m", "bubo", *args], capture_output=True, text=True, env=e, timeout=300,
                          stdin=subprocess.DEVNULL)


def one_error_line(proc, command):
    assert proc.returncode == 1, proc
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"bubo {command}: error: ")
    return lines[0]


def test_no_command_prints_the_help():
    p = bubo()
    assert p.returncode == 0 and "usage: bubo" in p.stdout and not p.stderr


def test_serve_rejects_a_bad_port_in_one_line():
    # the server itself is tested in tests/api (a real process on a free port)
    line = one_error_line(bubo("serve", "--port", "70000"), "serve")
    assert "--port 70000" in line


def test_serve_flag_wins_over_its_variable():
    line = one_error_line(bubo("serve", "--port", "-5", env={"BUBO_ARG_PORT": "8080"}), "serve")
    assert "--port -5" in line


def test_pull_unknown_name_lists_the_catalog(tmp_path):
    line = one_error_line(bubo("pull", "llama9:1t", home=tmp_path), "pull")
    assert "llama9:1t" in line and "smollm2:135m, gemma3:270m, qwen2.5-coder:0.5b" in line
    assert not (tmp_path / "models" / "llama9").exists()


def test_list_empty_store(tmp_path):
    p = bubo("list", home=tmp_path)
    assert p.returncode == 0 and p.stdout == ""
    assert f"bubo pull {store.DEFAULT_MODEL}" in p.stderr


@pytest.mark.models
def test_list_real_store(catalog_model):
    for name in ("smollm2:135m", "gemma3:270m", "qwen2.5-coder:0.5b"):
        catalog_model(name)
    p = bubo("list")
    assert p.returncode == 0, p.stderr
    rows = {line.split()[0]: line.split() for line in p.stdout.splitlines()[1:]}
    assert rows["smollm2:135m"][1:6] == ["98", "MB", "llama", "Q4_1", "8192"]
    assert rows["gemma3:270m"][1:6] == ["253", "MB", "gemma3", "Q4_K_M", "32768"]
    assert rows["qwen2.5-coder:0.5b"][1:6] == ["491", "MB", "qwen2", "Q4_K_M", "32768"]


def test_list_shows_unreadable_files(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "junk.gguf").write_bytes(b"not a gguf")
    p = bubo("list", home=tmp_path)
    assert p.returncode == 0
    assert p.stdout.splitlines()[1].split()[:6] == ["junk.gguf", "0", "MB", "?", "?", "?"]


def test_run_missing_model_file(tmp_path):
    line = one_error_line(bubo("run", "-m", str(tmp_path / "nope.gguf"), "-p", "hi"), "run")
    assert "nope.gguf does not exist" in line


def test_run_requires_a_model():
    # the prompt is optional now (none: an interactive chat); tests/test_cli_run.py covers run
    p = bubo("run", "-p", "hi")
    assert p.returncode == 2 and "no model" in p.stderr and "-m MODEL" in p.stderr


def test_flags_read_environment_and_flag_wins(tmp_path):
    env = {"BUBO_ARG_MODEL": str(tmp_path / "from-env.gguf"), "BUBO_ARG_PROMPT": "hi"}
    assert "from-env.gguf does not exist" in one_error_line(bubo("run", env=env), "run")
    line = one_error_line(bubo("run", "-m", str(tmp_path / "from-flag.gguf"), env=env), "run")
    assert "from-flag.gguf does not exist" in line


def test_bad_environment_value_is_a_usage_error():
    p = bubo("run", "-m", "x", "-p", "y", env={"BUBO_ARG_CTX_SIZE": "lots"})
    assert p.returncode == 2 and "BUBO_ARG_CTX_SIZE='lots'" in p.stderr


def test_run_zero_tokens_is_an_error(tmp_path):
    line = one_error_line(bubo("run", "-m", "smollm2:135m", "-p", "hi", "-n", "0", home=tmp_path), "run")
    assert "-n 0: give a positive number" in line


def test_bench_bad_repetitions(tmp_path):
    f = tmp_path / "x.gguf"
    f.write_bytes(b"x")
    line = one_error_line(bubo("bench", "-m", str(f), "-r", "0"), "bench")
    assert "-r must be at least 1" in line


@pytest.mark.parametrize("args,why", [
    (("-d", "-1"), "-d -1: the depth is a token count, 0 or more"),
    (("-d", "9000", "-n", "8"), "-d 9000: the depth and the test (9513 tokens) pass the model's context (8192)"),
    (("-ctk", "q4_0"), "--cache-type-k q4_0: K rows lose too much as q4_0"),
    (("-ctv", "q5_1"), "--cache-type-v q5_1: not a KV cache type here; give one of f16, f32, q8_0, q4_0"),
])
def test_bench_bad_depth_and_cache_types(catalog_model, args, why):
    catalog_model("smollm2:135m")
    line = one_error_line(bubo("bench", "-m", "smollm2:135m", *args), "bench")
    assert why in line, line


@pytest.mark.parametrize("command", [("serve", "--port", "0"), ("run", "hi")])
@pytest.mark.parametrize("flag,value,why", [
    ("-ctk", "q4_0", "q4_0: K rows lose too much as q4_0"),
    ("--cache-type-v", "bf16", "bf16: not a KV cache type here"),
])
def test_serve_and_run_refuse_cache_types_in_one_line(catalog_model, command, flag, value, why):
    catalog_model("smollm2:135m")
    line = one_error_line(bubo(command[0], "-m", "smollm2:135m", *command[1:], flag, value), command[0])
    named = (flag, "--cache-type-" + flag[-1]) if flag.startswith("-ct") else (flag,)
    assert why in line and any(f"{f} {why}" in line for f in named), line


def test_markdown_table_has_llama_bench_shape():
    rows = [{"model": "llama 135M Q4_1", "model_size": 88_200_000, "model_n_params": 134_515_008,
             "backend": "CPU", "n_threads": 2, "test": "pp512", "avg_ts": 317.123, "stddev_ts": 2.5},
            {"model": "llama 135M Q4_1", "model_size": 88_200_000, "model_n_params": 134_515_008,
             "backend": "CPU", "n_threads": 2, "test": "tg128", "avg_ts": 156.0, "stddev_ts": 0.25}]
    lines = markdown_table(rows).splitlines()
    cells = lambda line: [c.strip() for c in line.strip("|").split("|")]  # noqa: E731
    assert cells(lines[0]) == ["model", "size", "params", "backend", "threads", "test", "t/s"]
    assert all(c.endswith(":") for c in cells(lines[1])[1:3])
    assert cells(lines[2]) == ["llama 135M Q4_1", "84.11 MiB", "134.52 M", "CPU", "2", "pp512", "317.12 ± 2.50"]
    assert cells(lines[3])[-2:] == ["tg128", "156.00 ± 0.25"]
    assert len({len(line) for line in lines}) == 1


def test_serve_flags_and_variables():
    from bubo.api.serve import server_config
    from bubo.cli.flags import build_parser as _parser
    from bubo.cli.serve import options

    args = _parser().parse_args(["serve"])
    assert args.model == store.DEFAULT_MODEL == "qwen2.5-coder:1.5b" and args.port == 8080 and args.host == "127.0.0.1"
    assert args.ctx_size is None and args.debug_hooks is False
    os.environ["BUBO_ARG_ALIAS"] = "a1, a2"
    os.environ["BUBO_ARG_CTX_SIZE"] = "1024"
    try:
        args = _parser().parse_args(["serve", "-m", "/x/My-Model.Q4.gguf", "-c", "512", "--api-key", "k1,k2",
                                     "--cors-origins", "*", "--served-model-name", ""])
    finally:
        del os.environ["BUBO_ARG_ALIAS"], os.environ["BUBO_ARG_CTX_SIZE"]
    assert args.ctx_size == 512  # the flag wins over its variable
    cfg = server_config(options(args))
    assert cfg.served_model_name == "My-Model.Q4"
    assert cfg.model_names == ["My-Model.Q4", "a1", "a2", "bubo"]
    assert cfg.api_keys == ["k1", "k2"] and cfg.cors_origins == ["*"]
