#!/usr/bin/env python3
"""The web chat page of `quern serve`, driven in headless Chromium.

Starts a real server with the default model and drives the page through
Selenium and Debian's chromium-driver. It checks:
  - the page loads with its libraries (marked, highlight.js), shows the
    model's id, and the browser logs no error (a Content-Security-Policy
    violation would be one);
  - a message sent with the page's settings (temperature 0, max tokens)
    streams a reply whose text equals the API's answer to the same request,
    with the token-limit marker when the reply stopped there;
  - Stop during a long reply ends it at once, marks it stopped, and the
    server frees the request;
  - a conversation kept in the browser survives a reload, and its markdown is
    rendered: emphasis, highlighted code, and model-written HTML or
    javascript: links shown as text;
  - /webui/NAME of a file it lacks answers 404, and --no-webui turns the page
    off.

Usage: webui_e2e.py --quern build/quern [--model FILE] [--screenshot PNG]
Exits 1 on the first failure ("webui_e2e: all passed" on success).
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_e2e import Server, check  # noqa: E402
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,860", "--no-first-run", "--no-proxy-server"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def wait(driver, cond, what, timeout=60):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: cond(d))
    except Exception as e:
        raise AssertionError(f"{what}: not within {timeout} s ({type(e).__name__})") from None


def browser_errors(driver):
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def stored(driver):
    return driver.execute_script("return JSON.parse(localStorage.getItem('quern.conversations.v1') || '[]')")


def set_field(driver, name, value):
    el = driver.find_element(By.ID, "set-" + name)
    el.clear()
    if value != "":
        el.send_keys(str(value))
    driver.execute_script("arguments[0].dispatchEvent(new Event('change'))", el)


def send(driver, text):
    box = driver.find_element(By.ID, "input")
    box.clear()
    box.send_keys(text)
    driver.find_element(By.ID, "send").click()


def idle(driver):
    return driver.find_element(By.ID, "send").is_displayed()


def metric(srv, name):
    v = srv.metric(name)
    return 0 if v is None else v


def page_loads(driver, srv):
    driver.get(f"http://127.0.0.1:{srv.port}/")
    wait(driver, lambda d: srv.model_id in d.find_element(By.ID, "model-info").text, "the model id is shown")
    check(driver.execute_script("return typeof marked === 'object' && typeof hljs === 'object'"),
          "marked and highlight.js are loaded (install libjs-marked libjs-highlight.js and rebuild)")
    check(driver.title == "quern · " + srv.model_id, f"title {driver.title!r}")
    errors = browser_errors(driver)
    check(not errors, f"the page logs errors: {errors}")
    print("webui_e2e: page loads with its libraries, no console errors")


def reply_matches_api(driver, srv):
    check(not driver.find_element(By.ID, "settings").is_displayed(), "settings are shown before they are asked for")
    driver.find_element(By.ID, "toggle-settings").click()
    check(driver.find_element(By.ID, "settings").is_displayed(), "Settings does not show them")
    set_field(driver, "temperature", 0)
    set_field(driver, "max_tokens", 24)
    driver.find_element(By.ID, "toggle-settings").click()
    prompt = "Write a Python function that adds two numbers."
    send(driver, prompt)
    wait(driver, lambda d: not idle(d), "generation starts")
    wait(driver, idle, "the reply ends")
    msgs = stored(driver)[0]["messages"]
    check(len(msgs) == 2 and msgs[0] == {"role": "user", "content": prompt}, f"stored messages {msgs}")
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 24}
    status, _, data = srv.raw("POST", "/v1/chat/completions", json.dumps(body))
    check(status == 200, f"API status {status}")
    api = json.loads(data)["choices"][0]
    check(msgs[1]["content"] == api["message"]["content"],
          f"page reply {msgs[1]['content']!r} != API reply {api['message']['content']!r}")
    shown = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant .content")[-1].text
    check(shown.strip(), "the reply is rendered")
    meta = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant .meta")[-1].text
    check(("token limit" in meta) == (api["finish_reason"] == "length"),
          f"finish {api['finish_reason']}, marker {meta!r}")
    check("tok/s" in meta, f"no speed in {meta!r}")
    print(f"webui_e2e: streamed reply equals the API's ({len(api['message']['content'])} chars, {meta})")


def stop_ends_generation(driver, srv):
    driver.find_element(By.ID, "toggle-settings").click()
    set_field(driver, "max_tokens", 3000)
    driver.find_element(By.ID, "toggle-settings").click()
    send(driver, "Tell me a very long story about a lighthouse keeper.")
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant .content")[-1].text) > 20,
         "the long reply streams")
    t0 = time.monotonic()
    driver.find_element(By.ID, "stop").click()
    wait(driver, idle, "Stop returns to the prompt", timeout=2)
    meta = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant .meta")[-1].text
    check("stopped" in meta, f"no stop marker: {meta!r}")
    deadline = time.monotonic() + 3
    while metric(srv, "quern_http_requests_in_flight") > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    check(metric(srv, "quern_http_requests_in_flight") == 0, "the server still runs the stopped request")
    text = stored(driver)[0]["messages"][-1]["content"]
    time.sleep(0.5)
    check(stored(driver)[0]["messages"][-1]["content"] == text, "text kept arriving after Stop")
    print(f"webui_e2e: Stop ended the reply after {len(text)} chars; server freed it in "
          f"{time.monotonic() - t0:.2f} s")


HOSTILE = ("Here is **bold** and `code`.\n\n```python\ndef add(a, b):\n    return a + b\n```\n\n"
           "[click](javascript:window.pwned=3) [docs](https://example.com/) and inline <b onclick=x>html</b>\n\n"
           "<script>window.pwned = 1</script> <img src=x onerror=\"window.pwned = 2\">\n")


def markdown_and_reload(driver, srv):
    convs = stored(driver)
    convs.insert(0, {"id": "md", "title": "markdown check", "updated": 1, "messages": [
        {"role": "user", "content": "show markdown"},
        {"role": "assistant", "content": HOSTILE, "reasoning": "thinking it over", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}],
         "finish": "stop"}]})
    driver.execute_script("localStorage.setItem('quern.conversations.v1', JSON.stringify(arguments[0]))", convs)
    driver.refresh()
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant"), "the stored conversation is shown")
    titles = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#conversations .open")]
    check(titles[0] == "markdown check" and len(titles) == len(convs), f"conversation list {titles}")
    msg = driver.find_element(By.CSS_SELECTOR, ".msg.assistant")
    check(msg.find_element(By.CSS_SELECTOR, ".content strong").text == "bold", "**bold** not rendered")
    code = msg.find_element(By.CSS_SELECTOR, ".content pre code.hljs")
    check("def add" in code.text and code.find_elements(By.CSS_SELECTOR, "span.hljs-keyword"), "code not highlighted")
    check(not msg.find_elements(By.CSS_SELECTOR, ".content script, .content img, .content b"), "model HTML became elements")
    text = msg.find_element(By.CSS_SELECTOR, ".content").text
    check("<script>" in text and "<b onclick=x>" in text, f"model HTML not shown as text: {text!r}")
    links = [a.get_attribute("href") for a in msg.find_elements(By.CSS_SELECTOR, ".content a")]
    check(links == ["https://example.com/"], f"links {links}")
    check(driver.execute_script("return window.pwned === undefined"), "model output ran script")
    check("get_weather" in msg.find_element(By.CSS_SELECTOR, ".tool-calls").text, "tool call not shown")
    check(msg.find_element(By.CSS_SELECTOR, "details.reasoning").is_displayed(), "reasoning not shown apart")
    check(not browser_errors(driver), f"the page logs errors: {browser_errors(driver)}")
    print("webui_e2e: conversations survive a reload; markdown, code, reasoning and tool calls render; "
          "model HTML stays text")


def http_status(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quern", required=True)
    ap.add_argument("--model")
    ap.add_argument("--screenshot", help="save a screenshot of the page with a reply here")
    a = ap.parse_args()
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
    srv = Server(a.quern, ["--parallel", "2"], a.model)
    driver = browser()
    try:
        page_loads(driver, srv)
        reply_matches_api(driver, srv)
        stop_ends_generation(driver, srv)
        markdown_and_reload(driver, srv)
        if a.screenshot:  # the conversation with the model's replies
            driver.find_elements(By.CSS_SELECTOR, "#conversations .open")[1].click()
            driver.save_screenshot(a.screenshot)
        check(http_status(f"http://127.0.0.1:{srv.port}/webui/none.js") == 404, "a missing file is not 404")
    finally:
        driver.quit()
        srv.stop()
    off = Server(a.quern, ["--no-webui"], a.model)
    try:
        check(http_status(f"http://127.0.0.1:{off.port}/") == 404, "--no-webui still serves /")
    finally:
        off.stop()
    print("webui_e2e: all passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"webui_e2e: FAILED: {e}")
        sys.exit(1)
