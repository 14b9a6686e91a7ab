"""The Responses store (bubo/api/openai/stored.py) on its own: records whole or absent, the least
recently used dropped past the bound (also when a smaller bound reopens the file), and a file that
stops taking writes leaves the store working in memory with what it held."""

import sqlite3

from bubo.api.errors import ApiError
from bubo.api.openai import responses as rs
from bubo.api.openai.stored import ResponseStore, Stored


def record(n: int) -> Stored:
    return Stored({"id": f"resp_{n}", "object": "response", "output": [{"type": "message", "id": f"msg_o{n}"}]},
                  [{"type": "message", "id": f"msg_i{n}", "role": "user", "content": [{"type": "input_text",
                                                                                         "text": str(n)}]}])


def test_records_outlive_the_store_and_a_smaller_bound_drops_the_oldest(tmp_path):
    path = tmp_path / "r.sqlite3"
    st = ResponseStore(path, max_records=5)
    for n in range(5):
        st.put(record(n))
    assert st.get("resp_0") is not None  # now the most recently used
    st.close()
    st = ResponseStore(path, max_records=3)
    assert len(st) == 3 and st.problem is None
    assert [n for n in range(5) if st.get(f"resp_{n}") is not None] == [0, 3, 4]
    got = st.get("resp_4")
    assert got is not None and got.history() == record(4).items + record(4).response["output"]
    assert st.delete("resp_4") and not st.delete("resp_4") and st.get("resp_4") is None


def test_a_file_that_stops_taking_writes_leaves_the_records_in_memory(tmp_path):
    path = tmp_path / "r.sqlite3"
    st = ResponseStore(path, max_records=10)
    st.put(record(1))
    # the same file, open read-only from now on: every write fails (as a full disk's would)
    st._conn.close()
    st._conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False, isolation_level=None)
    st.put(record(2))
    assert st.problem is not None and "memory" in st.problem
    assert st.get("resp_1") is not None and st.get("resp_2") is not None
    assert st.delete("resp_1") and len(st) == 1


def test_a_path_that_cannot_be_a_folder_is_a_store_in_memory(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    st = ResponseStore(blocker / "home" / "r.sqlite3")
    assert st.problem is not None and "cannot open" in st.problem
    st.put(record(1))
    assert st.get("resp_1") is not None


def test_no_records_are_kept_with_a_bound_of_zero(tmp_path):
    st = ResponseStore(tmp_path / "r.sqlite3", max_records=0)
    st.put(record(1))
    assert st.get("resp_1") is None and len(st) == 0


def test_input_item_pages():
    items = [{"type": "message", "id": f"msg_{n}"} for n in range(5)]
    page = rs.item_list(items, {"limit": "2"})
    assert [i["id"] for i in page["data"]] == ["msg_4", "msg_3"] and page["has_more"]
    assert page["first_id"] == "msg_4" and page["last_id"] == "msg_3"
    page = rs.item_list(items, {"limit": "2", "order": "asc", "after": "msg_3"})
    assert [i["id"] for i in page["data"]] == ["msg_4"] and not page["has_more"]
    for bad in ({"limit": "0"}, {"limit": "x"}, {"order": "up"}, {"after": "msg_9"}):
        try:
            rs.item_list(items, bad)
        except ApiError as e:
            assert e.code == "invalid_value"
        else:
            raise AssertionError(bad)
