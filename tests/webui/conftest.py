"""What the chat page's browser tests share: a real `bubo serve` in router mode (qwen2.5-coder:0.5b,
and "thinker", smollm2 under a template whose prompt opens a <think> block; every model load takes
2 s more, so that the page's loading state can be seen), a headless Chromium (Debian's chromium
and chromium-driver, driven by Selenium) whose viewport is set exactly, and the page's helpers.
Each test leaves a screenshot of the state it checked in the output folder ($BUBO_TEST_OUTPUT,
else test-output/ in the repository)."""

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
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from bubo import store

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("BUBO_TEST_OUTPUT") or ROOT / "test-output") / "webui"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
QWEN = "qwen2.5-coder:0.5b"
THINKER = "thinker"
MAX_TOKENS = 48
LOAD_DELAY_S = 2
THINKING = (ROOT / "tests" / "api" / "testdata" / "thinking_template.jinja").read_text()
WIDE, PHONE = (1280, 900), (390, 844)

NO_BROWSER = ("no chromium and chromedriver on this machine (apt-get install chromium chromium-driver: "
              "ci/system-deps.sh installs them)" if CHROMIUM is None or DRIVER is None else None)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("webui")
    template = d / "think.jinja"
    template.write_text("{%- set open_think = true -%}\n" + THINKING)  # the prompt opens <think>
    preset = d / "models.ini"
    preset.write_text(f"[{THINKER}]\nmodel = {store.pull('smollm2:135m')}\nchat-template-file = {template}\n")
    ui = json.dumps({"temperature": 0, "max_tokens": MAX_TOKENS})
    s = Server("-m", QWEN, "--models-preset", str(preset), "--ui-config", ui, "-np", "2", "--debug-hooks",
               model=None, ctx=2048, env={"BUBO_DEBUG_LOAD_DELAY_S": str(LOAD_DELAY_S)})
    try:
        yield s.wait_ready()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(downloads: Path, srv: Server) -> Iterator[WebDriver]:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000",
              "--disable-gpu", "--no-first-run", "--disable-extensions"):
        opts.add_argument(a)
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(DRIVER), options=opts)
    d.set_page_load_timeout(60)
    d.execute_cdp_cmd("Browser.grantPermissions", {"origin": srv.url,
                                                   "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
    try:
        yield d
    finally:
        d.quit()


def viewport(d: WebDriver, size: tuple[int, int], theme: str | None = None) -> None:
    """The page's viewport exactly size (a phone's is a touch screen), and the system's colour
    scheme (None: light)."""
    w, h = size
    d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": w, "height": h, "deviceScaleFactor": 1,
                                                             "mobile": w < 500})
    d.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme",
                                                                   "value": theme or "light"}]})


def open_page(d: WebDriver, url: str) -> WebDriver:
    d.get(url + "/")
    wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))
    return d


@pytest.fixture
def page(browser: WebDriver, srv: Server) -> WebDriver:
    """The page, opened fresh with no saved conversations, 1280x900, the light theme."""
    viewport(browser, WIDE)
    browser.get(srv.url + "/")
    browser.execute_script("localStorage.clear()")
    return open_page(browser, srv.url)


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


def setting(d: WebDriver, name: str, value: str) -> None:
    """A conversation setting, as typing it in the settings dialog and leaving the field does."""
    d.find_element(By.ID, "open-settings").click()
    wait(d, lambda d: d.find_element(By.ID, "settings").get_attribute("open") is not None)
    d.execute_script("const e = document.getElementById('set-' + arguments[0]); e.value = arguments[1];"
                     "e.dispatchEvent(new Event('change'))", name, value)
    d.find_element(By.ID, "settings-done").click()
    wait(d, lambda d: d.find_element(By.ID, "settings").get_attribute("open") is None)


def no_sideways_scroll(d: WebDriver) -> bool:
    """Nothing makes the page wider than its viewport (code and tables scroll in their own box)."""
    return bool(d.execute_script(
        "const e = document.documentElement, b = document.body;"
        "return e.scrollWidth <= e.clientWidth && b.scrollWidth <= e.clientWidth && window.scrollX === 0"))


def conversation(title: str, turns: list[tuple[str, str]]) -> dict[str, Any]:
    """A conversation as the page stores and exports it: the turns (role, text) one after another."""
    nodes: dict[str, Any] = {}
    parent = None
    for i, (role, content) in enumerate(turns):
        nid = f"n{i}"
        nodes[nid] = {"id": nid, "parent": parent, "role": role, "content": content, "children": []}
        if parent:
            nodes[parent]["children"].append(nid)
        parent = nid
    return {"id": "c-" + title, "title": title, "created": 1, "updated": 2, "model": QWEN, "settings": {},
            "nodes": nodes, "roots": ["n0"], "leaf": parent}
