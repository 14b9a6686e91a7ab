"""`bubo run` (one answer, or an interactive chat driven in a pseudo-terminal as a user drives
it), `bubo rm`, `bubo show`, `bubo ps`, and catalog names without a tag.

The chats are checked against the library: greedy answers from the CLI must equal what
bubo.Model gives for the same conversation, asked in the same order on a fresh Model (the
same prefix reuse, so the same numbers)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pexpect
import pytest

from bubo import store

from reference.tiny import write_tiny_model

MODEL = "smollm2:135m"
PROMPT = ">>> "
THREADS = "2"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUBO_ARG_")}
    env.update(SKBUILD_EDITABLE_VERBOSE="0", BUBO_NOHISTORY="1", TERM="xterm")
    env.update(extra)
    return env


def bubo(*args: str, input: str | None = None, home=None, env: dict[str, str] | None = None):
    """`python -m bubo ARGS`, stdin from `input` (none: /dev/null, never the test's own)."""
    e = _env(**(env or {}))
    if home is not None:
        e["BUBO_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "bubo", *args], input=input, capture_output=True, text=True,
                          env=e, timeout=300, stdin=None if input is not None else subprocess.DEVNULL)


def one_error_line(proc, command: str, code: int = 1) -> str:
    assert proc.returncode == code, proc
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"bubo {command}: error: "), lines[0]
    return lines[0]


def spawn(*args: str, **env: str) -> pexpect.spawn:
    c = pexpect.spawn(sys.executable, ["-m", "bubo", "run", *args], encoding="utf-8", timeout=60,
                      env=_env(**env), dimensions=(50, 4000))
    c.expect_exact(PROMPT)
    return c


def ask(c: pexpect.spawn, text: str) -> str:
    """Send one line at the prompt; what came back before the next prompt (the reply, or a
    command's output), newlines as \\n, without the echoed line."""
    c.sendline(text)
    c.expect_exact(PROMPT)
    out = c.before.replace("\r\n", "\n")
    assert out.startswith(text + "\n"), out
    return out[len(text) + 1:]


def reply_of(out: str) -> str:
    """A reply as the chat prints it: the text, then a blank line."""
    assert out.endswith("\n\n"), out
    return out[:-2]


def exits(c: pexpect.spawn, status: int = 0) -> None:
    c.expect(pexpect.EOF, timeout=30)
    c.close()
    assert c.exitstatus == status and c.signalstatus is None, (c.exitstatus, c.signalstatus)


@pytest.fixture(scope="module")
def fresh_model(catalog_model):
    """A new library Model as `bubo run -t 2` loads it (the default -c 4096)."""
    import bubo

    catalog_model(MODEL)

    def make(name: str = MODEL, n_ctx: int = 4096):
        return bubo.Model(name, n_ctx=n_ctx, n_threads=int(THREADS))
    return make


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


# --- flags and names, no model needed ----------------------------------------------------------


@pytest.mark.parametrize("flags, expected", [
    (["-c", "-5"], "-c -5: give 0 (the trained context) or a positive number of tokens"),
    (["--ctx-size", "-5"], "--ctx-size -5: give 0 (the trained context)"),
    (["-t", "0"], "-t 0: give a positive number of threads"),
    (["-n", "0"], "-n 0: give a positive number of tokens, or -1 for no limit"),
    (["--n-predict", "-3"], "--n-predict -3: give a positive number of tokens"),
    (["--top-p", "2"], "--top-p 2.0: must be in [0.0, 1.0]"),
    (["--min-p", "-1"], "--min-p -1.0: must be in [0.0, 1.0]"),
    (["--repeat-penalty", "0"], "--repeat-penalty 0.0: must be > 0"),
    (["--repeat-last-n", "-2"], "--repeat-last-n -2: must be in [-1,"),
    (["-s", "-7"], "-s -7: must be in [-1,"),
])
def test_bad_values_name_the_flag_as_typed(tmp_path, flags, expected):
    # an empty store: the flags are checked before anything is pulled or loaded
    line = one_error_line(bubo("run", "smollm2", *flags, "hi", home=tmp_path), "run")
    assert expected in line
    assert not (tmp_path / "models").exists()


def test_bad_value_from_a_variable_names_the_variable(tmp_path):
    line = one_error_line(bubo("run", "smollm2", "hi", home=tmp_path, env={"BUBO_ARG_CTX_SIZE": "-3"}), "run")
    assert "BUBO_ARG_CTX_SIZE=-3: give 0 (the trained context)" in line


def test_unparsable_value_is_one_line_naming_the_flag(tmp_path):
    p = bubo("run", "smollm2", "--temp", "warm", "hi", home=tmp_path)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--temp" in lines[0] and "'warm'" in lines[0], p.stderr


def test_no_model_is_a_usage_error():
    p = bubo("run")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip() == (f"bubo run: error: no model: give one, as in `bubo run {store.DEFAULT_MODEL} [PROMPT]` "
                                "(or -m MODEL)")


def test_prompt_given_twice(tmp_path):
    line = one_error_line(bubo("run", "-m", str(tmp_path / "x.gguf"), "-p", "one", "two"), "run")
    assert "give the prompt once, as PROMPT or with -p" in line


def test_raw_and_chat_contradict(tmp_path):
    line = one_error_line(bubo("run", "smollm2", "--raw", "--chat", "hi", home=tmp_path), "run")
    assert "--raw and --chat" in line


def test_unknown_and_mistagged_names_list_the_catalog(tmp_path):
    line = one_error_line(bubo("run", "llama9", "hi", home=tmp_path), "run")
    assert "'llama9'" in line and "smollm2:135m, gemma3:270m, qwen2.5-coder:0.5b" in line
    line = one_error_line(bubo("pull", "smollm2:7b", home=tmp_path), "pull")
    assert "'smollm2:7b': the catalog has smollm2:135m" in line
    assert not (tmp_path / "models").exists()


def test_names_without_a_tag(monkeypatch):
    assert store.catalog_name("smollm2") == "smollm2:135m"
    assert store.catalog_name("smollm2:latest") == "smollm2:135m"  # Ollama's implicit tag
    assert store.catalog_name("qwen2.5-coder") == "qwen2.5-coder:0.5b"
    assert store.catalog_name("gemma3:270m") == "gemma3:270m"
    assert store.catalog_name("llama9") is None
    assert store.catalog_entry("gemma3").name == "gemma3:270m"
    # a family of several tags: the one marked default, else ambiguous (one line, the tags listed)
    base = store.CATALOG["smollm2:135m"]
    big = store.CatalogModel("smollm2:1.7b", "smollm2-1.7b.gguf", "0" * 64, 1, ())
    monkeypatch.setitem(store.CATALOG, big.name, big)
    with pytest.raises(store.UnknownModelError, match="smollm2 is ambiguous: give one of smollm2:135m, smollm2:1.7b"):
        store.catalog_name("smollm2")
    with pytest.raises(store.UnknownModelError, match="ambiguous"):
        store.resolve("smollm2")
    monkeypatch.setitem(store.CATALOG, big.name, store.CatalogModel(**{**big.__dict__, "default": True}))
    assert store.catalog_name("smollm2") == "smollm2:1.7b"
    assert store.catalog_name("smollm2:135m") == base.name


# --- rm --------------------------------------------------------------------------------------


def _fake_store(home):
    """A store holding smollm2:135m (a stand-in file; rm never reads it), its verified record,
    a copy at the legacy location, and a .gguf put there by hand."""
    models = home / "models"
    models.mkdir(parents=True)
    entry = store.CATALOG["smollm2:135m"]
    (models / entry.filename).write_bytes(b"GGUF stand-in")
    (models / f"{entry.filename}.verified").write_text("{}")
    (home / entry.filename).write_bytes(b"GGUF legacy stand-in")
    (models / "mine.gguf").write_bytes(b"GGUF mine")
    return models, entry


def test_rm_deletes_a_stored_model(tmp_path):
    models, entry = _fake_store(tmp_path)
    p = bubo("rm", "smollm2", home=tmp_path)  # the family name means its default tag
    assert p.returncode == 0, p.stderr
    assert p.stdout == "deleted 'smollm2:135m'\n"
    assert not (models / entry.filename).exists() and not (models / f"{entry.filename}.verified").exists()
    assert not (tmp_path / entry.filename).exists()  # or `list` would adopt it again
    assert [line.split()[0] for line in bubo("list", home=tmp_path).stdout.splitlines()[1:]] == ["mine.gguf"]
    line = one_error_line(bubo("rm", "smollm2:135m", home=tmp_path), "rm")
    assert line == "bubo rm: error: smollm2:135m is not stored; stored models: mine.gguf"
    p = bubo("rm", "mine.gguf", home=tmp_path)
    assert p.returncode == 0 and p.stdout == "deleted 'mine.gguf'\n"
    assert list(models.glob("*.gguf")) == []


def test_rm_unknown_name_and_files_outside_the_store(tmp_path):
    models, _ = _fake_store(tmp_path / "home")
    outside = tmp_path / "elsewhere.gguf"
    outside.write_bytes(b"GGUF")
    line = one_error_line(bubo("rm", "llama9", home=tmp_path / "home"), "rm")
    assert line == "bubo rm: error: no stored model is called 'llama9'; stored models: mine.gguf, smollm2:135m"
    one_error_line(bubo("rm", str(outside), home=tmp_path / "home"), "rm")
    assert outside.exists()
    # several names: each known one is deleted, each unknown one gets its line, exit 1
    p = bubo("rm", "mine.gguf", "nope", home=tmp_path / "home")
    assert p.returncode == 1 and p.stdout == "deleted 'mine.gguf'\n"
    assert p.stderr.startswith("bubo rm: error: no stored model is called 'nope'")


# --- show --------------------------------------------------------------------------------------


def test_show_a_model_not_stored(tmp_path):
    line = one_error_line(bubo("show", "smollm2", home=tmp_path), "show")
    assert line == "bubo show: error: smollm2:135m is not stored; get it with `bubo pull smollm2:135m`"
    assert not (tmp_path / "models").exists()  # show never downloads


@pytest.mark.models
def test_show(catalog_model, tmp_path):
    from bubo import GGUFFile

    path = catalog_model(MODEL)
    catalog_model("gemma3:270m")
    p = bubo("show", "smollm2")
    assert p.returncode == 0, p.stderr
    text = p.stdout
    for row in ("architecture        llama", "parameters          134.5M", "context length      8192",
                "embedding length    576", "quantization        Q4_1", "temperature         0.8",
                "top_k               40", "num_predict         -1"):
        assert f"    {row}\n" in text, (row, text)
    assert re.search(r"  License\n    apache-2.0\n", text), text
    assert re.search(r"  Capabilities\n    completion\n    chat\n", text), text
    assert "--template prints it" in text
    with GGUFFile(path) as f:
        template = f.metadata["tokenizer.chat_template"]
    assert bubo("show", "smollm2:135m", "--template").stdout == template + "\n"
    assert bubo("show", str(path), "--license").stdout == "apache-2.0\n"  # a path works too
    params = bubo("show", "smollm2", "--parameters").stdout.splitlines()
    assert params[0].split() == ["temperature", "0.8"] and ["seed", "-1"] in [r.split() for r in params]
    # gemma3:270m is a base model: no template; qwen's file names no license
    text = bubo("show", "gemma3").stdout
    assert "architecture        gemma3" in text and "none: a base model" in text
    assert re.search(r"  Capabilities\n    completion\n\n", text)
    assert "has no chat template" in one_error_line(bubo("show", "gemma3", "--template"), "show")
    # qwen's file names no license: the catalog's is shown; a file the catalog does not know has none
    catalog_model("qwen2.5-coder:0.5b")
    assert bubo("show", "qwen2.5-coder:0.5b", "--license").stdout == store.CATALOG["qwen2.5-coder:0.5b"].license + "\n"
    assert store.CATALOG["qwen2.5-coder:0.5b"].license.startswith("apache-2.0 (https://")
    tiny = write_tiny_model(tmp_path / "tiny.gguf", "llama")
    assert "names no license" in one_error_line(bubo("show", str(tiny), "--license"), "show")


# --- ps ----------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ps_without_a_server():
    port = _free_port()
    line = one_error_line(bubo("ps", "--port", str(port)), "ps")
    assert line.startswith(f"bubo ps: error: no server answers at http://127.0.0.1:{port} (")
    assert line.endswith("start one with `bubo serve`")


@pytest.mark.models
def test_ps_lists_what_a_server_serves(catalog_model):
    from api.conftest import start_server

    catalog_model(MODEL)
    # served by its family name: the server resolves it to the default tag as run and pull do
    with start_server("-m", "smollm2", "-np", "2", "--api-key", "k1,k2", model=None) as server:
        server.wait_ready(headers={"Authorization": "Bearer k1"})
        port = server.url.rsplit(":", 1)[1]
        line = one_error_line(bubo("ps", "--port", port), "ps")
        assert "refused to answer without an API key" in line and "--api-key" in line
        line = one_error_line(bubo("ps", "--port", port, "--api-key", "wrong"), "ps")
        assert "refused the API key given" in line
        for how in (["--api-key", "k2"], []):
            env = {} if how else {"BUBO_ARG_API_KEY": "k1"}
            p = bubo("ps", "--port", port, *how, env=env)
            assert p.returncode == 0, p.stderr
            rows = [r.split(None, 4) for r in p.stdout.splitlines()]
            assert rows[0] == ["NAME", "STATUS", "CONTEXT", "SLOTS", "ALIASES"]
            assert rows[1:] == [["smollm2", "loaded", "2048", "0/2", "busy  bubo"]], p.stdout


@pytest.mark.models
def test_pull_a_name_without_a_tag(catalog_model):
    path = catalog_model(MODEL)  # stored already: pull only verifies
    p = bubo("pull", "smollm2")
    assert p.returncode == 0 and p.stdout == f"{path}\n", p


# --- one answer --------------------------------------------------------------------------------


@pytest.mark.models
def test_one_answer_chats_by_default(fresh_model):
    m = fresh_model()
    want = m.chat([user("What is the capital of France?")], max_tokens=12, temperature=0).text
    got = bubo("run", "smollm2", "What is the capital of France?", "-n", "12", "--temp", "0", "-t", THREADS)
    assert got.returncode == 0 and got.stderr == "", got.stderr
    assert got.stdout == want + "\n"
    # -m/-p, words after flags, and the old --chat (a no-op now) say the same
    for args in (["-m", MODEL, "-p", "What is the capital of France?"],
                 ["-m", "smollm2", "What", "is", "the", "capital", "of", "France?"],
                 ["smollm2", "-n", "12", "What is the capital of France?", "--chat"]):
        p = bubo("run", *args, "-n", "12", "--temp", "0", "-t", THREADS)
        assert p.returncode == 0 and p.stdout == want + "\n", (args, p.stdout, p.stderr)


@pytest.mark.models
def test_raw_completes_the_text(fresh_model):
    m = fresh_model()
    want = m.complete("The capital of France is", max_tokens=8, temperature=0).text
    p = bubo("run", MODEL, "--raw", "The capital of France is", "-n", "8", "--temp", "0", "-t", THREADS)
    assert p.returncode == 0 and p.stdout == want + "\n", p
    assert want != m.chat([user("The capital of France is")], max_tokens=8, temperature=0).text


@pytest.mark.models
def test_stdin_is_the_prompt(fresh_model):
    m = fresh_model()
    opts = ["-n", "10", "--temp", "0", "-t", THREADS]
    text = "Name three colours."
    want = m.chat([user(text)], max_tokens=10, temperature=0).text + "\n"
    assert bubo("run", "smollm2", *opts, input=text + "\n").stdout == want
    assert bubo("run", "smollm2", "-p", "-", *opts, input=text + "\n").stdout == want
    # with a PROMPT too: the stdin text first (as Ollama), a blank line, then PROMPT
    joined = m.chat([user("roses are red\n\nWhat colour are roses?")], max_tokens=10, temperature=0).text
    p = bubo("run", "smollm2", "What colour are roses?", *opts, input="roses are red\n")
    assert p.returncode == 0 and p.stdout == joined + "\n", p
    line = one_error_line(bubo("run", "smollm2", *opts, input=""), "run")
    assert "no prompt: stdin is not a terminal and gave no text" in line
    assert "stdin gave no text" in one_error_line(bubo("run", "smollm2", "-p", "-", *opts, input="\n"), "run")


@pytest.mark.models
def test_system_message(fresh_model):
    m = fresh_model()
    sys_msg = {"role": "system", "content": "You are a pirate."}
    want = m.chat([sys_msg, user("Who are you?")], max_tokens=12, temperature=0).text
    p = bubo("run", "smollm2", "--system", "You are a pirate.", "Who are you?", "-n", "12", "--temp", "0",
             "-t", THREADS)
    assert p.stdout == want + "\n", p
    assert want != m.chat([user("Who are you?")], max_tokens=12, temperature=0).text
    line = one_error_line(bubo("run", "smollm2", "--raw", "--system", "x", "hi"), "run")
    assert "--system: a system message needs the chat template, and --raw leaves the chat template out" in line


@pytest.mark.models
def test_verbose_prints_timings(fresh_model):
    m = fresh_model()
    c = m.chat([user("Hi!")], max_tokens=6, temperature=0)
    p = bubo("run", "smollm2", "Hi!", "-n", "6", "--temp", "0", "-t", THREADS, "--verbose")
    assert p.returncode == 0 and p.stdout == c.text + "\n", p
    stats = dict(line.split(":", 1) for line in p.stderr.splitlines())
    assert list(stats) == ["total duration", "load duration", "prompt eval count", "prompt eval duration",
                           "prompt eval rate", "eval count", "eval duration", "eval rate"], p.stderr
    assert stats["prompt eval count"].strip() == f"{c.prompt_tokens} token(s)"
    assert stats["eval count"].strip() == f"{len(c.tokens)} token(s)"
    for key in ("prompt eval rate", "eval rate"):
        assert re.fullmatch(r"\d+\.\d\d tokens/s", stats[key].strip()), stats[key]
    for key in ("total duration", "load duration", "prompt eval duration", "eval duration"):
        assert re.fullmatch(r"\d+\.\d+m?s", stats[key].strip()), stats[key]

    def seconds(key: str) -> float:
        v = stats[key].strip()
        return float(v[:-2]) / 1000 if v.endswith("ms") else float(v[:-1])

    # the parts add up: the load is part of the total, as in Ollama's (2 ms of rounding)
    parts = seconds("load duration") + seconds("prompt eval duration") + seconds("eval duration")
    assert parts <= seconds("total duration") + 0.002, p.stderr


# --- the interactive chat ----------------------------------------------------------------------


@pytest.mark.models
def test_interactive_chat(fresh_model, tmp_path):
    c = spawn(MODEL, "--temp", "0", "-n", "16", "-t", THREADS)
    replies = []
    # history: the second answer is the library's answer to the two-turn conversation
    replies.append(reply_of(ask(c, "Hi, my name is Ada.")))
    replies.append(reply_of(ask(c, "What is my name?")))
    # /set changes the next answer; bad values and unknown commands get one line
    assert ask(c, "/set num_predict 4") == "Set parameter 'num_predict' to '4'\n"
    replies.append(reply_of(ask(c, "Tell me a joke.")))
    assert ask(c, "/set top_p 3").startswith("Couldn't set parameter 'top_p': must be in [0.0, 1.0]")
    assert ask(c, "/set parameter top_k x") == "Couldn't set parameter 'top_k': 'x' is not an integer\n"
    assert ask(c, "/set colour blue") == "Unknown command '/set colour'. Type /? set for help\n"
    assert ask(c, "/frobnicate now") == "Unknown command '/frobnicate'. Type /? for help\n"
    shown = ask(c, "/show")
    assert "  Set for this session\n    temperature         0.0\n    num_predict         4\n" in shown
    assert "  System\n    (none)\n" in shown
    assert "/save <file>" in ask(c, "/?")
    # /clear forgets the conversation; /system sets the system message
    assert ask(c, "/clear") == "Cleared session context\n"
    assert ask(c, "/system You are a pirate.") == "Set system message.\n"
    assert ask(c, "/set n 16") == "Set parameter 'num_predict' to '16'\n"
    replies.append(reply_of(ask(c, "Who are you?")))
    # a multi-line message
    c.sendline('"""')
    c.expect_exact("... ")
    c.sendline("Say hello")
    c.expect_exact("... ")
    replies.append(reply_of(ask(c, 'in French."""')))
    # /save writes the conversation; /load takes it back after /clear
    saved = tmp_path / "chat.json"
    assert ask(c, f"/save {saved}") == f"Saved the conversation (4 messages) to {saved}\n"
    assert ask(c, "/clear") == "Cleared session context\n"
    assert ask(c, "/system").startswith("Usage:")
    assert ask(c, f"/load {saved}") == f"Loaded the conversation (4 messages) from {saved}\n"
    assert ask(c, "/load /nonexistent/chat.json").startswith("error: couldn't load /nonexistent/chat.json:")
    assert "  System\n    You are a pirate.\n" in ask(c, "/show system")
    # --verbose's lines after each answer, once /set verbose
    assert ask(c, "/set verbose") == "Set 'verbose' mode.\n"
    out = ask(c, "Thanks!")
    reply, _, stats = out.partition("\n\ntotal duration:")
    replies.append(reply)
    assert "\nprompt eval count:" in stats and "\neval rate:" in stats and "load duration" not in stats
    # Ctrl-C at an empty prompt: the hint; with text typed: the line is dropped, no hint
    c.sendintr()
    c.expect_exact(PROMPT)
    assert c.before.replace("\r\n", "\n") == "\nUse Ctrl + d or /bye to exit.\n"
    c.send("half a thought")
    c.expect_exact("half a thought")
    c.sendintr()
    c.expect_exact(PROMPT)
    assert c.before.replace("\r\n", "\n") == "\n"
    c.sendline("/bye")
    exits(c)

    data = json.loads(saved.read_text())
    system = {"role": "system", "content": "You are a pirate."}
    assert data["model"] == MODEL and data["system"] == "You are a pirate."
    assert data["options"] == {"temperature": 0.0, "num_predict": 16}
    assert data["messages"] == [user("Who are you?"), assistant(replies[3]),
                                user("Say hello\nin French."), assistant(replies[4])]

    # the library, asked the same in the same order
    m = fresh_model()
    t1 = m.chat([user("Hi, my name is Ada.")], max_tokens=16, temperature=0).text
    t2 = m.chat([user("Hi, my name is Ada."), assistant(t1), user("What is my name?")], max_tokens=16,
                temperature=0).text
    t3 = m.chat([user("Hi, my name is Ada."), assistant(t1), user("What is my name?"), assistant(t2),
                 user("Tell me a joke.")], max_tokens=4, temperature=0)
    t4 = m.chat([system, user("Who are you?")], max_tokens=16, temperature=0).text
    t5 = m.chat([system, user("Who are you?"), assistant(t4), user("Say hello\nin French.")], max_tokens=16,
                temperature=0).text
    t6 = m.chat([system, *data["messages"], user("Thanks!")], max_tokens=16, temperature=0).text
    assert replies == [t1, t2, t3.text, t4, t5, t6]
    assert len(t3.tokens) == 4
    # the history mattered: asked alone, the second question gets another answer
    assert fresh_model().chat([user("What is my name?")], max_tokens=16, temperature=0).text != t2


@pytest.mark.models
def test_ctrl_c_stops_a_reply_and_the_chat_goes_on(fresh_model, tmp_path):
    c = spawn("smollm2", "--temp", "0", "-t", THREADS, "-c", "512")
    story = "Write a long story about a dragon."
    c.sendline(story)
    c.expect_exact(story + "\r\n")
    c.expect(r"\w+\W+\w+\W+\w+")  # the reply has begun (it runs for seconds: hundreds of tokens)
    c.sendintr()
    t0 = time.monotonic()
    c.expect_exact(PROMPT, timeout=10)
    assert time.monotonic() - t0 < 5
    assert ask(c, "/set num_predict 8") == "Set parameter 'num_predict' to '8'\n"
    after = reply_of(ask(c, "Thanks."))
    saved = tmp_path / "chat.json"
    ask(c, f"/save {saved}")
    c.sendeof()  # Ctrl-D leaves
    exits(c)

    messages = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2
    assert messages[2:] == [user("Thanks."), assistant(after)]
    partial = messages[1]["content"]  # the stopped reply stays in the conversation, as far as it went
    full = fresh_model(n_ctx=512).chat([user(story)], max_tokens=64, temperature=0).text
    assert partial and (full.startswith(partial) or partial.startswith(full)), (partial, full)
    assert len(partial) < 1000


@pytest.mark.models
def test_a_chat_outgrowing_the_context_drops_its_oldest_turns():
    c = spawn("smollm2", "--temp", "0", "-n", "24", "-t", THREADS, "-c", "160")
    notes = []
    for q in ("Hello there, who are you?", "Tell me about the sea.", "And the mountains?", "And the sky?"):
        out = ask(c, q)
        notes += re.findall(r"\(the conversation outgrew the 160-token context: dropped its \d+ oldest messages\)",
                            out)
        assert out.strip()
    assert notes, "four turns of ~50 tokens never outgrew 160 tokens"
    # one message longer than the whole context: an error, and the chat goes on
    out = ask(c, "word " * 200)
    assert re.fullmatch(r"error: the prompt is \d+ tokens but the context holds 160: give a larger -c "
                        r"\(this model was trained with 8192: -c 0 gives it all\)\n", out), out
    assert reply_of(ask(c, "Bye!"))
    c.sendeof()
    exits(c)


@pytest.mark.models
def test_base_model_chat_is_one_running_text(catalog_model):
    import bubo

    catalog_model("gemma3:270m")
    c = pexpect.spawn(sys.executable, ["-m", "bubo", "run", "gemma3", "--temp", "0", "-n", "8", "-t", THREADS],
                      encoding="utf-8", timeout=60, env=_env(), dimensions=(50, 4000))
    c.expect_exact(PROMPT)
    assert "gemma3:270m has no chat template (a base model)" in c.before
    first = reply_of(ask(c, "The capital of France is"))
    second = reply_of(ask(c, "The capital of Germany is"))
    assert ask(c, "/system be brief").startswith("A system message needs a chat template")
    c.sendline("/bye")
    exits(c)

    m = bubo.Model("gemma3", n_ctx=4096, n_threads=int(THREADS))
    a = m.complete("The capital of France is", max_tokens=8, temperature=0).text
    text = "The capital of France is" + a
    b = m.complete(text + ("" if text.endswith("\n") else "\n") + "The capital of Germany is", max_tokens=8,
                   temperature=0).text
    assert [first, second] == [a, b]


def test_interactive_needs_a_model_that_exists(tmp_path):
    # stdin a terminal, the model unknown: one line, before any prompt
    c = pexpect.spawn(sys.executable, ["-m", "bubo", "run", "llama9"], encoding="utf-8", timeout=60,
                      env=_env(BUBO_HOME=str(tmp_path)))
    c.expect(pexpect.EOF)
    c.close()
    assert c.exitstatus == 1
    assert c.before.strip().startswith("bubo run: error: unknown model 'llama9'")


@pytest.mark.models
def test_ctrl_c_ends_a_one_shot_answer(catalog_model):
    catalog_model(MODEL)
    c = pexpect.spawn(sys.executable, ["-m", "bubo", "run", "smollm2", "Write a long story about a dragon.",
                                       "--temp", "0", "-t", THREADS], encoding="utf-8", timeout=60, env=_env())
    c.expect(r"\w+\W+\w+\W+\w+")
    c.sendintr()
    exits(c, 130)  # interrupted: the shell's code for SIGINT, as for any command stopped by Ctrl-C


@pytest.mark.models
def test_line_editing_and_history_across_sessions(catalog_model, tmp_path):
    # BUBO_HOME keeps the typed lines ($BUBO_HOME/history); the model is given by its path
    path = str(catalog_model(MODEL))
    env = {"BUBO_HOME": str(tmp_path), "BUBO_NOHISTORY": ""}
    c = spawn(path, "-t", THREADS, **env)
    assert ask(c, "/set seed 42") == "Set parameter 'seed' to '42'\n"
    # readline: Left moves the cursor, the insert lands before the last letter: "/be" -> "/bye"
    c.send("/be")
    c.expect_exact("/be")
    c.send("\x1b[D")
    c.send("y\r")
    exits(c)
    assert (tmp_path / "history").read_text().splitlines()[-2:] == ["/set seed 42", "/bye"]
    c = spawn(path, "-t", THREADS, **env)
    c.send("\x1b[A\x1b[A\r")  # Up twice: the line before /bye, sent again
    c.expect_exact("Set parameter 'seed' to '42'")
    c.expect_exact(PROMPT)
    c.sendline("/bye")
    exits(c)
