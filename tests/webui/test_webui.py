"""The chat page at / in a real headless Chromium (Debian's chromium and chromium-driver, driven by
Selenium), against a real `bubo serve` in router mode: qwen2.5-coder:0.5b, and "thinker", smollm2
under a template whose prompt opens a <think> block. Each test leaves a screenshot of the state
it checked in the output folder ($BUBO_TEST_OUTPUT, else test-output/ in the repository).

What is checked: a message and its streamed answer (Markdown, highlighted code, tokens/s, the
same tokens as the API gives), stopping a generation, editing and regenerating into branches
that stay reachable, switching the model, a reasoning block, conversations found again after a
reload and by search, import and export (a bounded import: clear errors), HTML and script in
messages shown as text and never run, and a page that loads nothing from anywhere but the server."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from api.conftest import Server

from bubo import store

pytestmark = [pytest.mark.slow, pytest.mark.models]

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("BUBO_TEST_OUTPUT") or ROOT / "test-output") / "webui"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
QWEN = "qwen2.5-coder:0.5b"
THINKER = "thinker"
MAX_TOKENS = 48
THINKING = (ROOT / "tests" / "api" / "testdata" / "thinking_template.jinja").read_text()

if CHROMIUM is None or DRIVER is None:
    pytest.skip("no chromium and chromedriver on this machine (apt-get install chromium chromium-driver: "
                "ci/system-deps.sh installs them)", allow_module_level=True)

from selenium import webdriver  # noqa: E402 - only where a browser exists
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("webui")
    template = d / "think.jinja"
    template.write_text("{%- set open_think = true -%}\n" + THINKING)  # the prompt opens <think>
    preset = d / "models.ini"
    preset.write_text(f"[{THINKER}]\nmodel = {store.pull('smollm2:135m')}\nchat-template-file = {template}\n")
    ui = json.dumps({"temperature": 0, "max_tokens": MAX_TOKENS})
    s = Server("-m", QWEN, "--models-preset", str(preset), "--ui-config", ui, "-np", "2", model=None, ctx=2048)
    try:
        yield s.wait_ready()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(downloads: Path) -> Iterator[WebDriver]:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900",
              "--disable-gpu", "--no-first-run", "--disable-extensions"):
        opts.add_argument(a)
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(DRIVER), options=opts)
    d.set_page_load_timeout(60)
    try:
        yield d
    finally:
        d.quit()


@pytest.fixture
def page(browser: WebDriver, srv: Server) -> WebDriver:
    """The page, opened fresh with no saved conversations."""
    browser.get(srv.url + "/")
    browser.execute_script("localStorage.clear()")
    browser.get(srv.url + "/")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))
    return browser


def wait(d: WebDriver, cond: Callable[[WebDriver], Any], timeout: float = 120) -> Any:
    """cond's first truthy value; an element the page re-rendered meanwhile is looked up again."""
    return WebDriverWait(d, timeout, poll_frequency=0.05,
                         ignored_exceptions=(StaleElementReferenceException,)).until(cond)


def shot(d: WebDriver, name: str) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.png"
    d.save_screenshot(str(path))
    return path


def busy(d: WebDriver) -> bool:
    return d.find_element(By.TAG_NAME, "body").get_attribute("data-busy") == "1"


def send(d: WebDriver, text: str, finish: bool = True) -> None:
    box = d.find_element(By.ID, "input")
    box.clear()
    d.execute_script("arguments[0].value = arguments[1]", box, text)
    d.find_element(By.ID, "send").click()
    if finish:
        idle(d)


def idle(d: WebDriver) -> None:
    wait(d, lambda d: not busy(d))
    time.sleep(0.3)  # the last render


def messages(d: WebDriver) -> list[Any]:
    return d.find_elements(By.CSS_SELECTOR, "#messages .msg")


def answer_text(d: WebDriver) -> str:
    """The last answer's Markdown source, as it streamed in."""
    content = d.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant .content")[-1]
    return content.get_attribute("data-text") or ""


def api_chat(srv: Server, model: str, text: str, max_tokens: int = MAX_TOKENS) -> tuple[str, int]:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "temperature": 0,
            "max_tokens": max_tokens}
    req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    return str(out["choices"][0]["message"]["content"]), int(out["usage"]["completion_tokens"])


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
    code = wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant pre.hl code[data-highlighted]"))
    assert code[0].get_attribute("class") == "language-python"
    keyword = code[0].find_element(By.CSS_SELECTOR, "span.k")  # `def`, coloured by Pygments' classes
    assert keyword.text == "def" and keyword.value_of_css_property("color") != code[0].value_of_css_property("color")
    stats = assistant.find_element(By.CSS_SELECTOR, ".stats").text
    assert stats.startswith(f"{n_tokens} tokens \u00b7 ") and stats.endswith(" tokens/s")
    shot(page, "1-answer-with-code")


def test_stop_ends_the_generation(page):
    page.find_element(By.CSS_SELECTOR, "#settings summary").click()
    limit = page.find_element(By.ID, "set-max_tokens")
    limit.clear()
    limit.send_keys("400\t")
    page.find_element(By.CSS_SELECTOR, "#settings summary").click()
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


def test_switching_the_model_and_a_reasoning_block(page):
    Select(page.find_element(By.ID, "model")).select_by_value(THINKER)
    send(page, "What is 2 + 3?")
    reasoning = wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant details.reasoning"))[0]
    assert reasoning.find_element(By.TAG_NAME, "summary").text == "Reasoning"
    assert reasoning.get_attribute("open") is None  # collapsed
    reasoning.find_element(By.TAG_NAME, "summary").click()
    assert reasoning.find_element(By.TAG_NAME, "pre").text.strip()
    saved = page.execute_script("return Object.values(JSON.parse(localStorage.getItem('bubo.conversations')))")
    assert saved[0]["model"] == THINKER
    shot(page, "6-reasoning")


def setting(d: WebDriver, name: str, value: str) -> None:
    """A conversation setting, as typing it and leaving the field does."""
    d.execute_script("const e = document.getElementById('set-' + arguments[0]); e.value = arguments[1];"
                     "e.dispatchEvent(new Event('change'))", name, value)


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
    assert page.find_element(By.ID, "set-json_schema").get_attribute("value") == ""  # a new chat starts fresh
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
    hit.click()
    assert page.find_element(By.CSS_SELECTOR, ".msg.user .content").text == "Say hello to the owls."
    shot(page, "7-reloaded-and-searched")


def conversation(title: str, turns: list[tuple[str, str]]) -> dict[str, Any]:
    nodes, parent = {}, None
    for i, (role, content) in enumerate(turns):
        nid = f"n{i}"
        nodes[nid] = {"id": nid, "parent": parent, "role": role, "content": content, "children": []}
        if parent:
            nodes[parent]["children"].append(nid)
        parent = nid
    return {"id": "imported-" + title, "title": title, "created": 1, "updated": 2, "model": QWEN,
            "settings": {}, "nodes": nodes, "roots": ["n0"], "leaf": parent}


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
    page.find_element(By.CSS_SELECTOR, "#conv-list li").click()
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
