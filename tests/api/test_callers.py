"""Named callers (bubo.api.callers, bubo.api.auth): `NAME KEY` lines of --api-key-file. What a
caller stores (responses, contexts, slot files) is a 404 to another; each one's requests and tokens
are counted in /metrics and named in the log and /slots; --caller-max-slots keeps one caller from
holding every slot; the file is read again on SIGHUP (a wrong one keeps the keys) and a wrong file
stops the server at start, naming the line."""

from __future__ import annotations

import hmac
import http.client
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from client import call

from bubo.api import auth

from .conftest import MODEL, start_server

ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef00"
CAROL = "carol-key-0123456789abcdef"
PLAIN = "plainkey"  # llama-server's line: an unnamed caller
HI = [{"role": "user", "content": "Hi"}]
PROMPT = "Once upon a time, in a land far away, there lived a dragon who guarded a golden egg in a cave"


def _key_file(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(["# the team's keys", *lines]) + "\n")
    return path


# --- the key file and the comparison (no server) --------------------------------------------


@pytest.mark.parametrize("lines, line, says", [
    ([f"alice {ALICE}", f"alice {BOB}"], 3, "named on line 2 already"),
    ([f"alice {ALICE}", f"bob {ALICE}"], 3, "same key is on line 2"),
    ([PLAIN, f"bob {PLAIN}"], 3, "needs at least 16"),
    ([f"bob {BOB}", "", "# x", f"carol {CAROL} extra"], 5, "has 3 words"),
    (["alice short"], 2, "needs at least 16"),
    ([f"al/ice {ALICE}"], 2, "letters, digits"),
    ([f"alice {ALICE}", f"Alice {BOB}"], 3, "differing only in letter case"),
])
def test_a_wrong_key_file_names_its_line(tmp_path, lines, line, says):
    path = _key_file(tmp_path / "keys", *lines)
    with pytest.raises(auth.KeyFileError, match=rf"line {line}\b.*{says}"):
        auth.read_key_file(str(path))


def test_the_key_file_keeps_llama_servers_lines_and_names_callers(tmp_path):
    path = _key_file(tmp_path / "keys", PLAIN, "", f"  alice   {ALICE}  ", f"bob\t{BOB}\r")
    keys = auth.load_keys(["given-key"], str(path))
    assert keys.keys == ["given-key", PLAIN, ALICE, BOB]
    assert keys.names == {ALICE: "alice", BOB: "bob"}
    with pytest.raises(auth.KeyFileError, match="line 2: that key is given with --api-key too"):
        auth.load_keys([PLAIN], str(path))
    # an editor's byte-order mark is no part of the first key
    path.write_bytes(b"\xef\xbb\xbf" + f"alice {ALICE}\n".encode())
    assert auth.load_keys([], str(path)).names == {ALICE: "alice"}
    # a file without a key would let every request in
    _key_file(path, "", "# none yet")
    with pytest.raises(auth.KeyFileError, match="holds no key"):
        auth.load_keys([], str(path))
    assert auth.load_keys(["given-key"], str(path)).keys == ["given-key"]


def test_every_key_is_compared_in_constant_time_whatever_the_wrong_byte(monkeypatch):
    """The comparison is hmac.compare_digest's (constant time: the standard library's C
    function), made with every key whichever key is offered and wherever it differs: the work
    done for a wrong first byte and a wrong last byte is the same calls."""
    assert auth.hmac.compare_digest is hmac.compare_digest
    keys = [ALICE, BOB, CAROL]
    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)
    monkeypatch.setattr(auth.hmac, "compare_digest", recording)
    calls = []
    for wrong in ("X" + ALICE[1:], ALICE[:-1] + "X", ALICE, BOB, "short"):
        seen.clear()
        found = auth.matching_key([wrong], keys)
        assert found == (wrong if wrong in keys else None)
        calls.append([k for _, k in seen])
    assert all(c == [k.encode() for k in keys] for c in calls), calls


# --- a served team ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    keys = _key_file(home / "keys", f"alice {ALICE}", f"bob {BOB}", PLAIN)
    with start_server("-np", "4", "--api-key-file", str(keys), "--caller-max-slots", "2",
                      "--slot-save-path", str(home / "slots"), env={"BUBO_HOME": str(home)}) as s:
        s.wait_ready({"Authorization": f"Bearer {ALICE}"})
        s.keys = keys
        yield s


def _as(server, key, path, body=None, method=None):
    status, headers, data = call(server.url + path, method or ("POST" if body is not None else "GET"), body,
                                 headers={"Authorization": f"Bearer {key}"})
    return status, headers, (json.loads(data) if data[:1] in (b"{", b"[") else data.decode())


@pytest.mark.models
def test_stored_responses_and_contexts_are_their_callers_alone(team):
    status, _, resp = _as(team, ALICE, "/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 2})
    assert status == 200, resp
    rid = resp["id"]
    assert _as(team, ALICE, f"/v1/responses/{rid}")[0] == 200
    for key in (BOB, PLAIN):
        for method, path in (("GET", f"/v1/responses/{rid}"), ("GET", f"/v1/responses/{rid}/input_items"),
                             ("DELETE", f"/v1/responses/{rid}")):
            status, _, out = _as(team, key, path, method=method)
            assert status == 404 and out["error"]["code"] == "response_not_found", (key, path, out)
        status, _, out = _as(team, key, "/v1/responses", {"model": MODEL, "input": "And?", "max_output_tokens": 2,
                                                          "previous_response_id": rid})
        assert status == 404, out
    assert _as(team, ALICE, f"/v1/responses/{rid}")[0] == 200  # the others' deletes did nothing

    status, _, ctx = _as(team, ALICE, "/v1/contexts", {"prompt": PROMPT})
    assert status == 200, ctx
    cid = ctx["id"]
    unknown = _as(team, BOB, "/v1/contexts/ctx_000000000000000000000000")[2]
    for method, path, body in (("GET", f"/v1/contexts/{cid}", None), ("DELETE", f"/v1/contexts/{cid}", None),
                               ("POST", f"/v1/contexts/{cid}/fork", {}), ("POST", f"/v1/contexts/{cid}/snapshot", {}),
                               ("POST", "/completion", {"prompt": " and", "n_predict": 2, "context_id": cid}),
                               ("POST", "/v1/chat/completions", {"model": MODEL, "messages": HI, "max_tokens": 2,
                                                                  "context_id": cid})):
        status, _, out = _as(team, BOB, path, body, method)
        assert status == 404 and out["error"]["code"] == "context_not_found", (path, out)
        assert out["error"]["message"] == unknown["error"]["message"].replace("ctx_000000000000000000000000", cid)
    assert [c["id"] for c in _as(team, BOB, "/v1/contexts")[2]["data"]] == []
    assert cid in [c["id"] for c in _as(team, ALICE, "/v1/contexts")[2]["data"]]
    status, _, forks = _as(team, ALICE, f"/v1/contexts/{cid}/fork", {"n": 1})
    assert status == 200 and _as(team, BOB, f"/v1/contexts/{forks['data'][0]['id']}")[0] == 404  # forks stay hers
    status, _, out = _as(team, ALICE, "/completion", {"prompt": " and", "n_predict": 2, "context_id": cid})
    assert status == 200, out


def _slot_of(server, key, caller):
    slots = _as(server, key, "/slots")[2]
    return next(s["id"] for s in slots if s.get("caller") == caller and not s["is_processing"])


@pytest.mark.models
def test_slot_files_and_slots_are_their_callers_alone(team):
    status, _, out = _as(team, BOB, "/completion", {"prompt": "Bob's file.", "n_predict": 2})
    status, _, out = _as(team, BOB, f"/slots/{_slot_of(team, BOB, 'bob')}?action=save", {"filename": "b.bin"})
    assert status == 200, out
    status, _, out = _as(team, ALICE, "/completion", {"prompt": PROMPT * 2, "n_predict": 4, "temperature": 0})
    assert status == 200, out
    # her cached prompt is no hint to another caller (his cache is his own), and still hers
    assert _as(team, BOB, "/completion", {"prompt": PROMPT * 2, "n_predict": 1})[2]["timings"]["cache_n"] == 0
    assert _as(team, ALICE, "/completion", {"prompt": PROMPT * 2, "n_predict": 1})[2]["timings"]["cache_n"] >= 32
    status, _, out = _as(team, ALICE, "/completion", {"prompt": PROMPT * 2, "n_predict": 4, "temperature": 0})
    slot = _slot_of(team, BOB, "alice")  # /slots names each slot's caller, for every caller
    seen = {s["id"]: s for s in _as(team, BOB, "/slots")[2]}
    assert seen[slot]["params"] == {} and _as(team, ALICE, "/slots")[2][slot]["params"]["temperature"] == 0
    for action, body in (("save", {"filename": "mine.bin"}), ("erase", None), ("restore", {"filename": "b.bin"})):
        status, _, out = _as(team, BOB, f"/slots/{slot}?action={action}", body or {})
        assert status == 404 and "no conversation of this caller's" in out["error"]["message"], (action, out)
    status, _, saved = _as(team, ALICE, f"/slots/{slot}?action=save", {"filename": "mine.bin"})
    assert status == 200 and saved["n_saved"] > 0, saved
    for key in (BOB, PLAIN):  # her file is no file of theirs
        status, _, out = _as(team, key, f"/slots/{slot}?action=restore", {"filename": "mine.bin"})
        assert status == 404 and "no slot file 'mine.bin'" in out["error"]["message"], out
    status, _, out = _as(team, ALICE, f"/slots/{slot}?action=restore", {"filename": "mine.bin"})
    assert status == 200 and out["n_restored"] == saved["n_saved"], out
    # a caller's own file of the same name is another file
    status, _, out = _as(team, BOB, "/completion", {"prompt": "Bob's own words, not hers.", "n_predict": 2})
    bob_slot = _slot_of(team, BOB, "bob")
    status, _, out = _as(team, BOB, f"/slots/{bob_slot}?action=save", {"filename": "mine.bin"})
    assert status == 200 and out["n_saved"] < saved["n_saved"], out


def test_a_request_of_several_generations_counts_once_against_the_limit(team):
    """The decision API runs its questions at once: one request, one of the caller's 2 slots."""
    questions = {f"q{i}": {"type": "noul", "instructions": f"Is it about the number {i}?"} for i in range(4)}
    status, _, out = _as(team, ALICE, "/v1/systemone", {"model": MODEL, "state": "A ticket about 3.",
                                                        "questions": questions})
    assert status == 200 and sorted(out["answers"]) == sorted(questions), out


def _stream(url: str, key: str, body: dict, results: list, go: threading.Event) -> None:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    go.wait()
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = conn.getresponse()
    results.append((r.status, r.getheader("Retry-After"), r.read()))
    conn.close()


def _metric(text: str, name: str, caller: str, missing: float | None = None) -> float:
    m = re.search(rf'^bubo:caller_{name}{{caller="{re.escape(caller)}"}} (\S+)$', text, re.M)
    if m is None and missing is not None:
        return missing  # a caller not seen yet
    assert m, (name, caller, text[-2000:])
    return float(m.group(1))


@pytest.mark.models
def test_one_caller_cannot_hold_every_slot_and_each_is_counted(team):
    _as(team, PLAIN, "/health")  # the unnamed caller has been seen
    before = _as(team, ALICE, "/metrics")[2]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 160, "ignore_eos": True, "stream": True,
            "temperature": 0}
    results: list = []
    go = threading.Event()
    threads = [threading.Thread(target=_stream, args=(team.url, ALICE, body, results, go)) for _ in range(8)]
    for t in threads:
        t.start()
    go.set()
    # while her two streams run, another caller is served
    deadline = time.monotonic() + 60
    while len(results) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    status, _, out = _as(team, BOB, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 3})
    assert status == 200, out
    running = _metric(_as(team, BOB, "/metrics")[2], "requests_processing", "alice")
    for t in threads:
        t.join(120)
    statuses = sorted(r[0] for r in results)
    assert statuses == [200] * 2 + [429] * 6, statuses
    assert running == 2
    for status, retry, data in results:
        if status == 429:
            err = json.loads(data)["error"]
            assert retry == "1" and err["type"] == "rate_limit_error" and "--caller-max-slots" in err["message"]
        else:
            assert data.rstrip().endswith(b"data: [DONE]")
    # her slots are hers again once the streams ended; the counters moved by what was served
    status, _, out = _as(team, ALICE, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 3})
    assert status == 200, out
    after = _as(team, PLAIN, "/metrics")[2]
    assert _metric(after, "requests_processing", "alice") == 0
    assert _metric(after, "requests_total", "alice") - _metric(before, "requests_total", "alice", 0) == 1 + 8 + 1
    assert _metric(after, "tokens_predicted_total", "alice") - _metric(before, "tokens_predicted_total", "alice", 0) \
        == 160 * 2 + 3
    assert _metric(after, "tokens_predicted_total", "bob") >= 3 and _metric(after, "requests_total", "-") >= 1
    assert re.search(r"POST /v1/completions 200 .*caller=alice", "".join(team.log))


@pytest.mark.models
def test_sighup_rereads_the_key_file_and_a_wrong_one_keeps_the_keys(team):
    # an open connection outlives the reload
    parts = urlsplit(team.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", "/health", headers={"Authorization": f"Bearer {ALICE}"})
    assert conn.getresponse().read()
    _key_file(team.keys, f"alice {ALICE}", f"carol {CAROL}")
    team.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while _as(team, CAROL, "/health")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _as(team, CAROL, "/health")[0] == 200 and _as(team, BOB, "/health")[0] == 401
    assert _as(team, PLAIN, "/health")[0] == 401
    conn.request("GET", "/health", headers={"Authorization": f"Bearer {ALICE}"})
    r = conn.getresponse()
    assert r.status == 200 and r.read()
    n_log = len(team.log)
    _key_file(team.keys, f"alice {ALICE}", f"carol {CAROL}", f"alice {BOB}")
    team.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while not any("not reloaded" in line for line in team.log[n_log:]) and time.monotonic() < deadline:
        time.sleep(0.05)
    said = "".join(team.log[n_log:])
    assert "old ones stay in force" in said and "line 4" in said and "alice is named on line 2" in said, said
    n_log = len(team.log)
    _key_file(team.keys, "# emptied while being written")
    team.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while not any("not reloaded" in line for line in team.log[n_log:]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "holds no key" in "".join(team.log[n_log:]) and _as(team, PLAIN, "/health")[0] == 401
    assert _as(team, CAROL, "/health")[0] == 200 and _as(team, BOB, "/health")[0] == 401
    conn.request("GET", "/health", headers={"Authorization": f"Bearer {CAROL}"})
    assert conn.getresponse().status == 200
    conn.close()


@pytest.mark.models
def test_a_wrong_key_file_stops_the_server_at_start_naming_the_line(tmp_path):
    keys = _key_file(tmp_path / "keys", f"alice {ALICE}", PLAIN, f"bob {ALICE}")
    out = subprocess.run([sys.executable, "-m", "bubo", "serve", "-m", MODEL, "--port", "0",
                          "--api-key-file", str(keys)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert f"--api-key-file: {keys}, line 4: the same key is on line 2 already" in out.stderr, out.stderr
