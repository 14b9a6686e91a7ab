"""The chat page's look and feel in a real headless Chromium (fixtures and helpers: conftest.py), at
1280x900 and at a phone's 390x844, in the light and the dark theme:

- nothing scrolls the page sideways (code and tables scroll in their own box); below 760 px the
  conversation list is a drawer; the theme follows the system and the toggle is remembered;
- Markdown is drawn as the answer streams: sampled every 50 ms, a block once drawn (bold, a list,
  fenced code) never shows its raw markers again; the view follows the answer until the reader
  scrolls up, then offers "Jump to latest";
- Copy buttons put the code, or the whole answer, on the clipboard;
- the first screen names the model and offers examples; New chat reuses an empty conversation;
  the settings dialog shows the defaults in effect; text files attach to a message; Enter,
  Shift+Enter and Escape; the server's errors show in the conversation;
- axe-core (the axe-core-python package ships it) finds no serious or critical violation in
  either theme at either size.
The screenshots the README shows are taken here (test-output/webui/readme-*.png)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from .conftest import (
    MAX_TOKENS,
    NO_BROWSER,
    PHONE,
    QWEN,
    WIDE,
    answer_text,
    busy,
    conversation,
    idle,
    no_sideways_scroll,
    open_page,
    send,
    setting,
    shot,
    viewport,
    wait,
)

pytestmark = [pytest.mark.slow, pytest.mark.models]
if NO_BROWSER:
    pytest.skip(NO_BROWSER, allow_module_level=True)

CODE = "def add(a, b):\n    # a long line, wider than a phone: " + "x + " * 60 + "1\n    return a + b"
ANSWER = ("Here is **the function**, with a table:\n\n- it adds\n- it returns\n\n```python\n" + CODE + "\n```\n\n"
          "| name | what it does with its two arguments, at some length |\n|---|---|\n| add | "
          + "sums " * 40 + "|\n\nA long address: https://example.org/" + "a" * 200)


def with_conversation(d: WebDriver, url: str, conv: dict[str, Any]) -> None:
    """The page holding this one conversation (as an import would leave it), open."""
    d.execute_script("localStorage.setItem('bubo.conversations', JSON.stringify(arguments[0]))", {conv["id"]: conv})
    open_page(d, url)
    wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant .content"))


def theme(d: WebDriver) -> str:
    return str(d.execute_script("return document.documentElement.dataset.theme"))


def serious(d: WebDriver) -> list[Any]:
    """axe-core's serious and critical violations on the page as it is."""
    from axe_core_python.selenium import Axe

    result = Axe().run(d)
    return [(v["id"], v["impact"], [n["target"] for n in v["nodes"]][:3]) for v in result["violations"]
            if v["impact"] in ("serious", "critical")]


def clipboard(d: WebDriver) -> str:
    return str(d.execute_async_script("const done = arguments[0]; navigator.clipboard.readText().then(done, "
                                      "(e) => done('error: ' + e))"))


# --- layout, themes, the drawer, accessibility --------------------------------------------------------


@pytest.mark.parametrize("size", [WIDE, PHONE], ids=["1280x900", "390x844"])
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_layout_at_each_size_and_theme(browser, srv, size, scheme):
    viewport(browser, size, scheme)
    browser.get(srv.url + "/")
    browser.execute_script("localStorage.clear()")
    with_conversation(browser, srv.url, conversation("Layout", [("user", "Show me add."), ("assistant", ANSWER)]))
    assert theme(browser) == scheme  # the system's preference, no choice made
    w = size[0]
    assert no_sideways_scroll(browser), w
    pre = browser.find_element(By.CSS_SELECTOR, ".codeblock pre")
    assert browser.execute_script("return arguments[0].scrollWidth > arguments[0].clientWidth", pre)  # its own box
    # a table's cells break between words, never inside one ("name" is not drawn as "na/me")
    lines = browser.execute_script("""return [...document.querySelectorAll('.msg .content th, .msg .content td')]
        .filter(c => !c.textContent.includes(' ')).map(c => { const r = document.createRange();
        r.selectNodeContents(c); return r.getClientRects().length; })""")
    assert lines and all(n == 1 for n in lines), lines
    name = f"{w}x{size[1]}-{scheme}"
    shot(browser, f"layout-{name}")
    sidebar = browser.find_element(By.ID, "sidebar")
    opener = browser.find_element(By.ID, "open-drawer")
    if size == PHONE:
        assert sidebar.rect["x"] + sidebar.rect["width"] <= 0 and opener.is_displayed()  # a drawer, closed
        chat = browser.find_element(By.ID, "messages")
        assert chat.rect["width"] >= w - 24  # the conversation has the width
        opener.click()
        wait(browser, lambda d: d.find_element(By.ID, "sidebar").rect["x"] >= 0)
        assert browser.find_element(By.ID, "scrim").is_displayed() and opener.get_attribute("aria-expanded") == "true"
        assert no_sideways_scroll(browser)
        shot(browser, f"drawer-{name}")
        browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
        wait(browser, lambda d: d.find_element(By.ID, "sidebar").rect["x"] + d.find_element(By.ID, "sidebar").rect[
            "width"] <= 0)
    else:
        assert sidebar.rect["x"] == 0 and sidebar.is_displayed() and not opener.is_displayed()
    assert serious(browser) == []
    browser.find_element(By.ID, "open-settings").click()
    wait(browser, lambda d: d.find_element(By.ID, "settings").get_attribute("open") is not None)
    assert no_sideways_scroll(browser)
    assert serious(browser) == []
    shot(browser, f"settings-{name}")
    browser.find_element(By.ID, "settings-done").click()
    if w == WIDE[0] or scheme == "light":  # the README's pictures: both themes, and a phone
        shot(browser, f"readme-{name}")


def test_the_theme_toggle_is_remembered(browser, srv):
    viewport(browser, WIDE, "dark")
    browser.get(srv.url + "/")
    browser.execute_script("localStorage.clear()")
    open_page(browser, srv.url)
    assert theme(browser) == "dark"
    toggle = browser.find_element(By.ID, "theme")
    assert toggle.get_attribute("aria-pressed") == "true"
    toggle.click()
    assert theme(browser) == "light" and toggle.get_attribute("aria-pressed") == "false"
    dark_bg = "22, 23, 26"  # --bg of the dark theme
    assert dark_bg not in browser.find_element(By.TAG_NAME, "body").value_of_css_property("background-color")
    open_page(browser, srv.url)
    assert theme(browser) == "light"  # the choice outlives a reload, against the system's dark
    browser.find_element(By.ID, "theme").click()
    assert theme(browser) == "dark"
    assert dark_bg in browser.find_element(By.TAG_NAME, "body").value_of_css_property("background-color")


def test_markdown_in_the_page_is_text_and_bounded(page):
    """The renderer on its own: raw HTML stays text, only http(s) and mailto links, nested lists and
    tables; input built to make a naive renderer quadratic is drawn (the script's timeout bounds it)."""
    page.set_script_timeout(20)
    out = page.execute_script("""
        const box = document.createElement('div');
        BuboMarkdown.update(box, arguments[0], {code: (b) => document.createTextNode('[code ' + b.lang + ']')});
        return box.innerHTML;""", "<b>x</b> [a](javascript:alert(1)) [b](https://example.org) "
                                  "**s** _e_ `c`\n\n- one\n  - two\n\n| h |\n|---|\n| v |")
    assert "&lt;b&gt;x&lt;/b&gt;" in out and "<b>" not in out and 'href="javascript' not in out
    assert '<a href="https://example.org" rel="noopener noreferrer" target="_blank">b</a>' in out
    assert "<strong>s</strong>" in out and "<em>e</em>" in out and "<code>c</code>" in out
    assert "<ul><li>one<ul><li>two</li></ul></li></ul>" in out and "<th>h</th>" in out and "<td>v</td>" in out
    for hostile in ["*a " * 50_000, "_" * 100_000, "[" * 100_000, "**x" * 30_000, "`" * 50_000 + "x",
                    "- " * 40_000, "> " * 40_000 + "x", "| a " * 20_000 + "\n|---|\n", "~~a " * 30_000,
                    "a_b " * 30_000, "`a ``b " * 20_000]:
        n = page.execute_script("""
            const box = document.createElement('div');
            BuboMarkdown.update(box, arguments[0], {code: (b) => document.createTextNode(b.code)});
            return box.childNodes.length;""", hostile)
        assert n > 0  # drawn (a line of "_" or "- " is a rule: a node, no text)


# --- streaming: Markdown as it comes, following the answer ---------------------------------------------

MARKDOWN_ASK = ("Answer in Markdown: first a sentence with one **bold** word, then a bulleted list of three "
                "fruits, then a python code block that prints hello, then one more sentence.")
SAMPLE = """const c = [...document.querySelectorAll('#messages .msg.assistant .content')].pop();
if (!c) return null;
return {strong: c.querySelectorAll('strong').length, li: c.querySelectorAll('li').length,
        code: c.querySelectorAll('.codeblock').length, text: c.textContent, busy: document.body.dataset.busy};"""


def test_markdown_is_drawn_as_it_streams_and_never_reverts(page):
    setting(page, "max_tokens", "200")
    send(page, MARKDOWN_ASK, finish=False)
    samples = []
    while True:
        s = page.execute_script(SAMPLE)
        if s is not None:
            samples.append(s)
            if s["busy"] == "0" and len(samples) > 1:
                break
        time.sleep(0.05)
    final = samples[-1]
    assert final["strong"] and final["li"] >= 3 and final["code"], final  # the answer has all three
    assert len(samples) >= 10, len(samples)  # it was watched as it came
    seen = {"strong": 0, "li": 0, "code": 0}
    for s in samples:
        for k in seen:
            assert s[k] >= seen[k], (k, s, seen)  # what was drawn stays drawn
            seen[k] = max(seen[k], s[k])
        if s["strong"]:
            assert "**bold**" not in s["text"], s
        if s["li"]:
            assert "\n- " not in s["text"] and not s["text"].startswith("- "), s
        if s["code"]:
            assert "```" not in s["text"], s
    assert "```python" in answer_text(page)  # the source was Markdown all along
    shot(page, "markdown-streamed")


def scroll_state(d: WebDriver) -> tuple[int, int, int]:
    return tuple(d.execute_script("const s = document.getElementById('scroller');"
                                  "return [s.scrollTop, s.scrollHeight, s.clientHeight]"))  # type: ignore[return-value]


def at_end(d: WebDriver) -> bool:
    top, height, client = scroll_state(d)
    return height - top - client <= 48


def test_the_view_follows_the_answer_until_the_reader_scrolls_up(page):
    viewport(page, PHONE)  # a narrow column: the answer outgrows the view at once
    setting(page, "max_tokens", "400")
    send(page, "Write the numbers from 1 to 200, one per line, nothing else.", finish=False)  # long, greedy
    wait(page, lambda d: scroll_state(d)[1] > scroll_state(d)[2] + 300)
    for _ in range(5):  # following: at the end however much comes
        assert at_end(page), scroll_state(page)
        time.sleep(0.1)
    page.execute_script("document.getElementById('scroller').scrollTop = 0")
    grown = scroll_state(page)[1]
    wait(page, lambda d: scroll_state(d)[1] > grown + 100)  # more came meanwhile
    assert scroll_state(page)[0] < 5  # the reader is left where they went
    jump = page.find_element(By.ID, "jump")
    assert jump.is_displayed() and jump.text.startswith("Jump to latest")
    shot(page, "scrolled-up")
    jump.click()
    assert at_end(page) and not jump.is_displayed()
    grown = scroll_state(page)[1]
    wait(page, lambda d: scroll_state(d)[1] > grown + 50 or not busy(d))
    assert at_end(page)  # following again
    page.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)  # Escape stops
    idle(page)
    assert page.find_elements(By.CSS_SELECTOR, ".msg.assistant .failed")[-1].text == "Stopped."
    assert at_end(page)  # still at the end after the stop
    viewport(page, WIDE)


# --- copying ----------------------------------------------------------------------------------------


def test_copy_buttons_put_the_code_and_the_answer_on_the_clipboard(page, srv):
    with_conversation(page, srv.url, conversation("Copy", [("user", "Show me add."), ("assistant", ANSWER)]))
    block = page.find_element(By.CSS_SELECTOR, ".codeblock")
    assert block.find_element(By.CSS_SELECTOR, ".lang").text == "python"
    button = block.find_element(By.CSS_SELECTOR, ".copy-code")
    assert button.get_attribute("aria-label") == "Copy the python code"
    button.click()
    wait(page, lambda d: button.get_attribute("data-copied") == "1")
    assert clipboard(page) == CODE
    shot(page, "copied-code")
    answer = page.find_element(By.CSS_SELECTOR, ".msg.assistant .copy-answer")
    answer.click()
    wait(page, lambda d: answer.get_attribute("data-copied") == "1")
    assert clipboard(page) == ANSWER  # the answer's Markdown source


# --- the first screen, new chats, settings -----------------------------------------------------------


def test_the_first_screen_names_the_model_and_new_chat_reuses_an_empty_one(page):
    empty = page.find_element(By.ID, "empty")
    assert empty.is_displayed() and f"Talking to {QWEN}" in empty.text
    examples = page.find_elements(By.CSS_SELECTOR, "#examples button")
    assert len(examples) >= 3
    shot(page, "first-screen")
    for _ in range(3):
        page.find_element(By.ID, "new-chat").click()
    assert len(page.find_elements(By.CSS_SELECTOR, "#conv-list li")) == 1  # one empty conversation, reused
    text = examples[1].text
    examples[1].click()
    idle(page)
    assert page.find_element(By.CSS_SELECTOR, ".msg.user .content").text == text
    assert page.find_element(By.CSS_SELECTOR, "#conv-list li .title").text == text[:60]  # titled from it
    assert not page.find_element(By.ID, "empty").is_displayed()
    page.find_element(By.ID, "new-chat").click()
    page.find_element(By.ID, "new-chat").click()
    assert len(page.find_elements(By.CSS_SELECTOR, "#conv-list li")) == 2


def test_the_settings_dialog_shows_the_defaults_in_effect(page, srv):
    props = json.loads(page.execute_script(
        "const r = new XMLHttpRequest(); r.open('GET', '/props?model=" + QWEN + "', false); r.send(); "
        "return r.responseText"))["default_generation_settings"]["params"]
    page.find_element(By.ID, "open-settings").click()
    dialog = wait(page, lambda d: d.find_element(By.ID, "settings") if d.find_element(By.ID, "settings")
                  .get_attribute("open") is not None else None)
    fields = {k: page.find_element(By.ID, f"set-{k}") for k in
              ("temperature", "max_tokens", "top_k", "top_p", "min_p", "seed", "system", "json_schema", "tools")}
    ph = {k: f.get_attribute("placeholder") for k, f in fields.items()}
    assert ph["temperature"] == "default: 0" and ph["max_tokens"] == f"default: {MAX_TOKENS}"  # --ui-config's
    assert fields["temperature"].get_attribute("title") == "this server's default for new conversations"
    assert ph["top_k"] == f"default: {props['top_k']}" and ph["top_p"] == f"default: {round(props['top_p'], 3):g}"
    assert ph["min_p"] == f"default: {round(props['min_p'], 3):g}" and ph["seed"] == "default: random"
    assert fields["top_k"].get_attribute("title") == "the model's default"
    assert all(ph.values()), ph  # no field without its default
    shot(page, "settings-dialog")
    page.find_element(By.ID, "set-temperature").send_keys(Keys.ESCAPE)  # Escape closes the dialog
    wait(page, lambda d: dialog.get_attribute("open") is None)


# --- attachments, the keyboard, errors ----------------------------------------------------------------


def test_text_files_attach_to_a_message_as_fenced_blocks(page, tmp_path):
    src = tmp_path / "adder.py"
    src.write_text("def add(a, b):\n    return a + b\n")
    page.find_element(By.ID, "attach").send_keys(str(src))
    chip = wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, "#attachments .chip"))[0]
    assert chip.text.startswith("adder.py")
    # a file dropped on the message box attaches too; a binary file is refused with a message
    page.execute_script("""
        const dt = new DataTransfer();
        dt.items.add(new File(['notes: ``` fences ```\\n'], 'notes.md', {type: 'text/markdown'}));
        dt.items.add(new File([new Uint8Array([0, 1, 2, 255])], 'blob.bin'));
        document.getElementById('composer').dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true}));""")
    wait(page, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#attachments .chip")) == 2)
    assert "blob.bin is not a text file" in page.find_element(By.ID, "error").text
    shot(page, "attachments")
    send(page, "What does this do?")
    user = page.find_element(By.CSS_SELECTOR, ".msg.user .content").text
    assert user.startswith("What does this do?\n\nadder.py:\n```python\ndef add(a, b):\n    return a + b\n```"), user
    assert "notes.md:\n````markdown\nnotes: ``` fences ```\n````" in user  # a longer fence than the file's own
    assert not page.find_elements(By.CSS_SELECTOR, "#attachments .chip")  # sent with it, gone


def test_the_keyboard_enter_shift_enter_and_escape(page):
    box = page.find_element(By.ID, "input")
    box.send_keys("line one", Keys.SHIFT, Keys.ENTER, Keys.SHIFT, "line two")
    assert box.get_attribute("value") == "line one\nline two" and not page.find_elements(By.CSS_SELECTOR, ".msg")
    box.send_keys(Keys.ENTER)
    wait(page, lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.user"))
    assert page.find_element(By.CSS_SELECTOR, ".msg.user .content").text == "line one\nline two"
    idle(page)
    # every control can be reached and named: the message box says what the keys do
    assert box.get_attribute("aria-describedby") == "keys"
    assert "Escape stops the answer" in page.find_element(By.ID, "keys").text


def test_the_servers_errors_show_in_the_conversation(page):
    setting(page, "max_tokens", "0")
    send(page, "Hello?")
    failed = page.find_element(By.CSS_SELECTOR, ".msg.assistant .failed")
    assert "max_tokens" in failed.text and "must be" in failed.text, failed.text  # the server's own words
    shot(page, "server-error")
    assert answer_text(page) == ""
