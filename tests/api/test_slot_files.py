"""llama-server's slot files (POST /slots/{id}?action=save|restore|erase, --slot-save-path) on real
servers (smollm2:135m): a slot saved by one server and restored by another continues as if it had
never been saved; bad file names and every damaged file are 400s that change nothing."""

import json
import struct

import pytest
from client import call_json

from .conftest import start_server

pytestmark = pytest.mark.models

BLOCK = 32
STORY = ("Once upon a time, in a land far away, there lived a dragon who guarded a golden egg in a cave above the "
         "sea, and every winter the villagers below climbed the cliffs to bring it bread, salt and stories of the "
         "world, which it loved more than gold. One spring a girl named Mira came alone, carrying no bread at all, "
         "only a question about the stars that nobody in the village could answer, and the dragon, who had")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def saver(folder):
    """One slot: every request is slot 0's (requests do not pick their slot with id_slot here)."""
    with start_server("-np", "1", "--slot-save-path", str(folder)) as s:
        yield s.wait_ready()


def post(server, path, body=None):
    return call_json(server.url + path, "POST", body if body is not None else {})


def completion(server, prompt, **kw):
    status, out = post(server, "/completion", {"prompt": prompt, "n_predict": 16, "temperature": 0, **kw})
    assert status == 200, out
    return out


def test_a_slot_restored_by_another_server_continues_as_never_saved(saver, folder):
    status, tok = post(saver, "/tokenize", {"content": STORY})
    ids = tok["tokens"]
    full = ids + completion(saver, ids, return_tokens=True)["tokens"]
    status, saved = post(saver, "/slots/0?action=save", {"filename": "story.bin"})
    assert status == 200, saved
    # the slot's whole blocks: the prompt and answer as far as the KV cache keeps them
    n = saved["n_saved"]
    assert n % BLOCK == 0 and len(ids) - BLOCK < n <= len(ids) + 16
    assert saved["n_written"] == (folder / "story.bin").stat().st_size and saved["timings"]["save_ms"] >= 0

    more = post(saver, "/tokenize", {"content": " She asked it why the stars move."})[1]["tokens"]
    with start_server("-np", "2", "--slot-save-path", str(folder)) as other:
        other.wait_ready()
        status, restored = post(other, "/slots/0?action=restore", {"filename": "story.bin"})
        assert status == 200 and restored["n_restored"] == n and restored["n_read"] == saved["n_written"], restored
        prompt = full[:n] + more
        warm = completion(other, prompt)
        assert warm["timings"]["cache_n"] == n  # the restored rows, not read again
        cold = completion(other, prompt, cache_prompt=False)
        assert warm["content"] == cold["content"] and warm["tokens_predicted"] == cold["tokens_predicted"]
        # saved again (slot 0 holds the story, or a request that starts with it): the same rows
        status, again = post(other, "/slots/0?action=save", {"filename": "again.bin"})
        assert status == 200 and again["n_saved"] == n
        assert (folder / "again.bin").read_bytes() == (folder / "story.bin").read_bytes()
        status, erased = post(other, "/slots/0?action=erase")
        assert status == 200 and erased["id_slot"] == 0 and erased["n_erased"] >= n
        status, empty = post(other, "/slots/0?action=save", {"filename": "empty.bin"})
        assert status == 200 and empty["n_saved"] == 0
        assert post(other, "/slots/1?action=restore", {"filename": "empty.bin"})[1]["n_restored"] == 0


@pytest.mark.parametrize("name", ["", "../story.bin", "/etc/passwd", "a/b.bin", "a\\b.bin", ".hidden", "x" * 256,
                                  "a\u0000b", "tab\tname", 5, None])
def test_a_file_name_that_is_not_a_plain_name_is_a_400(saver, name):
    for action in ("save", "restore"):
        status, out = post(saver, f"/slots/0?action={action}", {"filename": name})
        assert status == 400 and out["error"]["code"] == "invalid_value", (action, name, out)


def _damaged(folder, data):
    path = folder / "damaged.bin"
    path.write_bytes(data)
    return path.name


def test_every_damaged_file_is_a_400_and_changes_nothing(saver, folder):
    completion(saver, STORY)
    status, saved = post(saver, "/slots/0?action=save", {"filename": "good.bin"})
    assert status == 200 and saved["n_saved"] > 0
    good = (folder / "good.bin").read_bytes()
    n_header = struct.unpack_from("<I", good, 12)[0]
    header_end = 16 + n_header
    cuts = [0, 4, 8, 14, 16, 16 + n_header // 2, header_end, header_end + 6, len(good) // 2, len(good) - 1]
    flips = [0, 9, 13, 20, 16 + n_header // 2, header_end + 1, header_end + 4 * saved["n_saved"] + 3,
             len(good) // 2, len(good) - 1, len(good) - 200]
    cases = [good[:c] for c in cuts] + [good[:i] + bytes([good[i] ^ 0x5A]) + good[i + 1:] for i in flips]
    head = json.loads(good[16:header_end])
    other = json.dumps({**head, "model_sha256": "0" * 64}).encode()  # another model's file
    cases.append(good[:12] + struct.pack("<I", len(other)) + other + good[header_end:])
    cases.append(good + b"\0")  # a byte too many
    for i, data in enumerate(cases):
        status, out = post(saver, "/slots/0?action=restore", {"filename": _damaged(folder, data)})
        assert status == 400 and out["error"]["code"] == "invalid_slot_file", (i, out)
    status, out = post(saver, "/slots/0?action=restore", {"filename": "nope.bin"})
    assert status == 404 and "no slot file" in out["error"]["message"]
    # nothing was half restored: the slot still holds what it held, and the good file restores
    status, again = post(saver, "/slots/0?action=save", {"filename": "good2.bin"})
    assert status == 200 and (folder / "good2.bin").read_bytes() == good
    status, out = post(saver, "/slots/0?action=restore", {"filename": "good.bin"})
    assert status == 200 and out["n_restored"] == saved["n_saved"]


def test_bad_actions_and_slots(saver, base_url):
    assert post(saver, "/slots/0?action=fly", {"filename": "x"})[0] == 400
    assert post(saver, "/slots/1?action=erase")[0] == 400
    status, out = call_json(base_url + "/slots/0?action=save", "POST", {"filename": "x.bin"})
    assert status == 501 and "--slot-save-path" in out["error"]["message"]  # the shared server has none
