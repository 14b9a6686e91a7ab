"""The chat page's conversations in a real headless Chromium against a real `bubo serve` (the
fixtures and helpers: conftest.py): a message and its streamed answer (Markdown drawn in the page,
highlighted code, tokens/s, the same tokens as the API gives), stopping a generation, editing and
regenerating into branches that stay reachable, switching the model (the model loading, then a
reasoning block), settings (a JSON schema, tools), conversations found again after a reload and by
search, import and export (a bounded import: clear errors), HTML and script in messages shown as
text and never run, and a page that loads nothing from anywhere but the server. The page's layout,
themes, streaming, copying, attachments and accessibility: test_webui_layout.py."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from .conftest import (
    LOAD_DELAY_S,
    NO_BROWSER,
    QWEN,
    THINKER,
    answer_text,
    api_chat,
    busy,
    conversation,
    idle,
    messages,
    send,
    setting,
    shot,
    wait,
)

pytestmark = [pytest.mark.slow, pytest.mark.models]
if NO_BROWSER:
    pytest.skip(NO_BROWSER, allow_module_level=True)


CODE = "Reply with only a Python code block defining add(a, b)."


def test_a_message_streams_its_answer_with_highlighted_code(page, srv):
    send(page, CODE, finish=False)
    wait(page, lambda d: busy(d))
    assert page.find_element(By.ID, "stop").is_displayed() and not page.find_element(By.ID, "send").is_displayed()
    idle(page)
    user, assistant = messages(page)
    assert user.find_element(By.CSS_SELECTOR, ".content").text == CODE
    text, n_tokens = api_chat(srv, QWEN, CODE)
    assert answer_text(page) == text  # the page's request is the API's, greedy
    block = assistant.find_element(By.CSS_SELECTOR, ".content .codeblock")
    assert block.find_element(By.CSS_SELECTOR, ".code-head .lang").text == "python"
    code = block.find_element(By.CSS_SELECTOR, "pre code.language-python")
    keyword = code.find_element(By.CSS_SELECTOR, "span.tok-keyword")  # `def`, coloured in the page
    assert keyword.text == "def" and keyword.value_of_css_property("color") != code.value_of_css_property("color")
    assert "```" not in assistant.find_element(By.CSS_SELECTOR, ".content").text  # drawn, not raw
    stats = assistant.find_element(By.CSS_SELECTOR, ".stats").text
    assert stats.startswith(f"{n_tokens} tokens \u00b7 ") and stats.endswith(" tokens/s")
    shot(page, "1-answer-with-code")


def test_stop_ends_the_generation(page):
    setting(page, "max_tokens", "400")
    send(page, "Write a long story about a lighthouse keeper.", finish=False)
    wait(page, lambda d: len(answer_text(d)) > 20)
    page.find_element(By.ID, "stop").click()
    idle(page)
    (assistant,) = page.find_elements(By.CSS_SELECTOR, ".msg.assistant")
    assert assistant.find_element(By.CSS_SELECTOR, ".failed").text == "Stopped."
    kept = answer_text(page)
    assert 20 < len(kept) < 1500
    shot(page, "2-stopped")
    # the slot is free again: the next message is answered
    send(page, "Say OK.")
    assert len(page.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2 and answer_text(page)


def test_edit_and_regenerate_make_branches_that_stay_reachable(page):
    send(page, "Say hi.")
    first_answer = answer_text(page)
    page.find_element(By.CSS_SELECTOR, ".msg.user .edit").click()
    editor = page.find_element(By.CSS_SELECTOR, ".msg.user textarea.edit-text")
    # edited in place at the conversation's full width, its Edit button gone meanwhile
    editing = page.find_element(By.CSS_SELECTOR, ".msg.user.editing")
    column = page.find_element(By.ID, "messages")
    assert editing.size["width"] >= column.size["width"] - 40, (editing.size, column.size)
    assert not editing.find_element(By.CSS_SELECTOR, ".edit").is_displayed()
    shot(page, "3a-editing")
    editor.clear()
    editor.send_keys("Say bye.")
    page.find_element(By.CSS_SELECTOR, ".msg.user .save-edit").click()
    idle(page)
    user = page.find_element(By.CSS_SELECTOR, ".msg.user")
    assert user.find_element(By.CSS_SELECTOR, ".content").text == "Say bye."
    assert user.find_element(By.CSS_SELECTOR, ".branch .count").text == "2/2"
    second_answer = answer_text(page)
    shot(page, "3-edited-branch")
    user.find_element(By.CSS_SELECTOR, ".branch .prev").click()
    user = page.find_element(By.CSS_SELECTOR, ".msg.user")
    assert user.find_element(By.CSS_SELECTOR, ".content").text == "Say hi."
    assert user.find_element(By.CSS_SELECTOR, ".branch .count").text == "1/2"
    assert answer_text(page) == first_answer
    shot(page, "4-first-branch")
    page.find_element(By.CSS_SELECTOR, ".msg.user .branch .next").click()
    assert answer_text(page) == second_answer
    # regenerate the answer: a second version beside the first, both reachable
    page.find_element(By.CSS_SELECTOR, ".msg.assistant .regen").click()
    idle(page)
    assistant = page.find_element(By.CSS_SELECTOR, ".msg.assistant")
    assert assistant.find_element(By.CSS_SELECTOR, ".branch .count").text == "2/2"
    assistant.find_element(By.CSS_SELECTOR, ".branch .prev").click()
    assert answer_text(page) == second_answer
    shot(page, "5-regenerated")


def test_switching_the_model_it_loading_and_a_reasoning_block(page):
    Select(page.find_element(By.ID, "model")).select_by_value(THINKER)
    send(page, "What is 2 + 3?", finish=False)
    # the model is not loaded: the answer and the model's state say it loads ({LOAD_DELAY_S} s and more)
    wait(page, lambda d: any("Loading thinker" in e.text for e in d.find_elements(By.CSS_SELECTOR, ".msg.assistant "
                                                                                 ".waiting")), timeout=LOAD_DELAY_S + 3)
    assert "loading" in page.find_element(By.ID, "model-state").text
    shot(page, "6a-model-loading")
    idle(page)
    assert not page.find_elements(By.CSS_SELECTOR, ".msg.assistant .waiting")
    reasoning = wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant details.reasoning"))[0]
    assert reasoning.find_element(By.TAG_NAME, "summary").text == "Reasoning"
    assert reasoning.get_attribute("open") is None  # collapsed
    reasoning.find_element(By.TAG_NAME, "summary").click()
    assert reasoning.find_element(By.TAG_NAME, "pre").text.strip()
    saved = page.execute_script("return Object.values(JSON.parse(localStorage.getItem('bubo.conversations')))")
    assert saved[0]["model"] == THINKER
    shot(page, "6-reasoning")


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
ADD = [{"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]


def test_a_json_schema_setting_and_tool_calls_shown(page):
    setting(page, "json_schema", json.dumps(PERSON))
    send(page, "Invent a person.")
    person = json.loads(answer_text(page))
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)
    saved = page.execute_script("return Object.values(JSON.parse(localStorage.getItem('bubo.conversations')))")
    assert json.loads(saved[0]["settings"]["json_schema"]) == PERSON  # kept with the conversation
    shot(page, "11-json-schema")
    page.find_element(By.ID, "new-chat").click()
    page.find_element(By.ID, "open-settings").click()
    # the dialog is filled, then shown, once the server's defaults are read
    wait(page, lambda d: d.find_element(By.ID, "settings").get_attribute("open") is not None)
    assert page.find_element(By.ID, "set-json_schema").get_attribute("value") == ""  # a new chat starts fresh
    page.find_element(By.ID, "settings-done").click()
    setting(page, "tools", json.dumps(ADD))
    send(page, "What is 3 + 4? Use the tool.")
    call = wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant .tool-call"))[0]
    assert call.find_element(By.CSS_SELECTOR, ".tool-name").text == "Tool call: add"
    assert json.loads(call.find_element(By.CSS_SELECTOR, ".tool-args").text) == {"a": 3, "b": 4}
    shot(page, "12-tool-call")


def test_conversations_survive_a_reload_and_are_found_by_search(page):
    send(page, "Say hello to the owls.")
    page.find_element(By.ID, "new-chat").click()
    send(page, "Name a colour.")
    page.refresh()
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#conv-list li")) == 2)
    assert [m.find_element(By.CSS_SELECTOR, ".content").text for m in page.find_elements(
        By.CSS_SELECTOR, ".msg.user")] == ["Name a colour."]  # the latest conversation is open again
    search = page.find_element(By.ID, "search")
    search.send_keys("owls")
    (hit,) = page.find_elements(By.CSS_SELECTOR, "#conv-list li")
    hit.find_element(By.CSS_SELECTOR, ".title").click()
    assert page.find_element(By.CSS_SELECTOR, ".msg.user .content").text == "Say hello to the owls."
    shot(page, "7-reloaded-and-searched")


HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def test_html_and_script_in_messages_are_text(page, tmp_path):
    send(page, HOSTILE + " **bold**")
    user = page.find_element(By.CSS_SELECTOR, ".msg.user .content")
    assert user.text.startswith("<img src=x") and not user.find_elements(By.CSS_SELECTOR, "*")
    # an answer holding markup (imported, so it is exactly this): shown as text, the Markdown rendered
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps({"conversations": [conversation(HOSTILE, [
        ("user", "hi"), ("assistant", HOSTILE + '\n\n**bold** [link](javascript:window.__pwned=3)')])]}))
    page.find_element(By.ID, "import").send_keys(str(path))
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#conv-list li")) == 2)
    titles = [li.find_element(By.CSS_SELECTOR, ".title") for li in page.find_elements(By.CSS_SELECTOR, "#conv-list li")]
    (title,) = [t for t in titles if t.get_attribute("textContent") == HOSTILE]  # the imported one, as text
    assert not title.find_elements(By.CSS_SELECTOR, "*")
    title.click()
    content = wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant .content strong"))
    assert content[0].text == "bold"
    body = page.find_element(By.CSS_SELECTOR, ".msg.assistant .content")
    assert "<script>" in body.text and not body.find_elements(By.CSS_SELECTOR, "img, script, a[href^=javascript]")
    assert page.execute_script("return window.__pwned === undefined")
    assert not page.find_elements(By.CSS_SELECTOR, "#messages img, #messages script, #conv-list img")
    shot(page, "8-html-as-text")


def test_export_and_import_round_trip_and_bounds(page, downloads, tmp_path):
    send(page, "Say one word.")
    for f in downloads.glob("*.json"):
        f.unlink()
    page.find_element(By.ID, "export").click()
    exported = wait(page, lambda d: list(downloads.glob("bubo-conversations*.json")), timeout=30)[0]
    time.sleep(0.2)
    data = json.loads(exported.read_text())
    (conv,) = data["conversations"]
    assert [n["content"] for n in conv["nodes"].values()][0] == "Say one word."
    page.execute_script("localStorage.clear()")
    page.refresh()
    wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))
    assert not page.find_elements(By.CSS_SELECTOR, "#conv-list li")
    page.find_element(By.ID, "import").send_keys(str(exported))
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#conv-list li")) == 1)
    page.find_element(By.CSS_SELECTOR, "#conv-list li .title").click()
    assert page.find_element(By.CSS_SELECTOR, ".msg.user .content").text == "Say one word."
    shot(page, "9-imported")
    # a huge import is refused with a clear message, and nothing changes
    huge = tmp_path / "huge.json"
    with huge.open("w") as f:
        f.write('{"conversations": [' + ",".join(['{"x": "' + "y" * 1000 + '"}'] * 21000) + "]}")
    page.find_element(By.ID, "import").send_keys(str(huge))
    error = wait(page, lambda d: d.find_element(By.ID, "error") if d.find_element(By.ID, "error").is_displayed()
                 else None)
    assert "Import failed: the file is" in error.text and "at most 20971520" in error.text
    shot(page, "10-import-too-large")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"conversations": [{"nodes": {"a": {"id": "a", "role": "user", "content": "x",
                                                                  "children": ["zz"]}}, "roots": ["a"]}]}))
    page.find_element(By.ID, "import").send_keys(str(bad))
    wait(page, lambda d: "child that is not there" in d.find_element(By.ID, "error").text)
    # a cycle (each message the other's parent and child) would hang the page: refused
    loop = tmp_path / "loop.json"
    user = {"role": "user", "content": "x"}
    loop.write_text(json.dumps({"conversations": [{"roots": ["r"], "leaf": "a", "nodes": {
        "r": {**user, "id": "r", "parent": None, "children": []},
        "a": {**user, "id": "a", "parent": "b", "children": ["b"]},
        "b": {**user, "id": "b", "parent": "a", "children": ["a"]}}}]}))
    page.find_element(By.ID, "import").send_keys(str(loop))
    wait(page, lambda d: "not reached from its roots" in d.find_element(By.ID, "error").text)
    assert len(page.find_elements(By.CSS_SELECTOR, "#conv-list li")) == 1


def test_the_page_loads_nothing_but_from_the_server(page, srv):
    origin = srv.url.rstrip("/")
    urls = page.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert all(u.startswith(origin + "/") for u in urls), urls
    assert not page.find_elements(By.CSS_SELECTOR, "[src^=http], link[href^=http], script[src]")
    req = urllib.request.Request(srv.url + "/", headers={"Accept": "text/html"})
    with urllib.request.urlopen(req, timeout=10) as r:
        csp = r.headers["Content-Security-Policy"]
        html = r.read().decode()
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "script-src 'nonce-" in csp
    assert '"temperature": 0' in html and '"max_tokens": 48' in html  # --ui-config's defaults
    severe = [e for e in page.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def test_typing_reads_the_conversation_into_the_servers_cache(page, srv):
    before = len(srv.log)
    page.find_element(By.ID, "input").send_keys("Tell me three short facts about the river ferryman who sells")
    # 600 ms after the last keystroke the page sends POST /v1/prefill (the request log's line)
    wait(page, lambda d: any("POST /v1/prefill 200" in line for line in srv.log[before:]), timeout=15)
    line = next(line for line in srv.log[before:] if "POST /v1/prefill" in line)
    assert "generated=0" in line and f"model={QWEN}" in line
