// quern's web chat: one page over POST /v1/chat/completions (streamed).
// Conversations and settings live in the browser's localStorage; nothing is
// kept on the server. Markdown is rendered by marked and code highlighted by
// highlight.js when the server was built with them (Debian's libjs-marked and
// libjs-highlight.js); without them replies are shown as plain text.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE_KEY = "quern.conversations.v1";
const SETTINGS_KEY = "quern.settings.v1";
// Sampling fields left empty are not sent, so the server's defaults (the
// model's generation_config.json where it has one) apply.
const SETTING_FIELDS = ["system", "temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "tools", "api_key"];
const NUMBER_FIELDS = { temperature: parseFloat, top_p: parseFloat, top_k: parseInt, min_p: parseFloat,
                        max_tokens: parseInt, seed: parseInt };

let conversations = [];   // [{id, title, updated, messages: [{role, content, reasoning?, tool_calls?, finish?, error?, stats?}]}]
let currentId = null;
let settings = {};
let controller = null;    // the AbortController of the reply being streamed

// ------------------------------------------------------------------ storage

function load() {
  try { conversations = JSON.parse(localStorage.getItem(STORE_KEY)) || []; } catch { conversations = []; }
  try { settings = JSON.parse(localStorage.getItem(SETTINGS_KEY)) || {}; } catch { settings = {}; }
  if (!Array.isArray(conversations)) conversations = [];
}

function save() {
  try {
    localStorage.setItem(STORE_KEY, JSON.stringify(conversations));
  } catch (e) {
    setStatus("could not save the conversations (browser storage full?): " + e.message, true);
  }
}

function current() {
  return conversations.find((c) => c.id === currentId) || null;
}

function newConversation() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat",
              updated: Date.now(), messages: [] };
  conversations.unshift(c);
  currentId = c.id;
  save();
  return c;
}

// ------------------------------------------------------------------ markdown

const escapeHtml = (s) => String(s).replace(/[&<>"']/g,
  (ch) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[ch]));

// Model output is untrusted: raw HTML is shown as text and only http(s),
// mailto and in-page links become links.
const safeUrl = (u) => (/^(https?:|mailto:|#)/i.test(u || "") ? u : null);

let streamingRender = false;  // auto-detecting a code block's language is slow: only in the final render

function setupMarkdown() {
  if (!window.marked) return;
  marked.use({
    gfm: true,
    langPrefix: "hljs language-",
    highlight(code, lang) {
      if (!window.hljs) return code;
      try {
        if (lang && hljs.getLanguage(lang)) return hljs.highlight(lang, code, true).value;
        if (!streamingRender && code.length < 20000) return hljs.highlightAuto(code).value;
      } catch { /* fall through: unhighlighted */ }
      return escapeHtml(code);
    },
    renderer: {
      html: (html) => escapeHtml(html),
      link(href, title, text) {
        const u = safeUrl(href);
        if (!u) return text;
        const t = title ? ` title="${escapeHtml(title)}"` : "";
        return `<a href="${escapeHtml(u)}"${t} target="_blank" rel="noopener noreferrer">${text}</a>`;
      },
      image(href, title, text) {  // remote images are not fetched: shown as a link
        const u = safeUrl(href);
        return u ? `<a href="${escapeHtml(u)}" target="_blank" rel="noopener noreferrer">🖼 ${escapeHtml(text || u)}</a>`
                 : escapeHtml(text || "");
      },
    },
  });
}

function renderMarkdown(el, text) {
  if (window.marked) {
    el.innerHTML = marked.parse(text);
    for (const pre of el.querySelectorAll("pre")) addCopyButton(pre);
  } else {
    el.classList.add("plain");
    el.textContent = text;
  }
}

function addCopyButton(pre) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = "copy";
  b.textContent = "Copy";
  b.addEventListener("click", () => {
    const code = pre.querySelector("code");
    navigator.clipboard?.writeText(code ? code.textContent : pre.textContent)
      .then(() => { b.textContent = "Copied"; setTimeout(() => { b.textContent = "Copy"; }, 1200); })
      .catch(() => { b.textContent = "Copy failed"; });
  });
  pre.appendChild(b);
}

// ------------------------------------------------------------------ rendering

function renderSidebar() {
  const ul = $("conversations");
  ul.replaceChildren();
  for (const c of conversations) {
    const li = document.createElement("li");
    if (c.id === currentId) li.className = "active";
    const open = document.createElement("button");
    open.type = "button";
    open.className = "open";
    open.textContent = c.title;
    open.title = c.title;
    open.addEventListener("click", () => { if (!controller) { currentId = c.id; renderAll(); } });
    const del = document.createElement("button");
    del.type = "button";
    del.className = "delete";
    del.textContent = "×";
    del.title = "Delete this conversation";
    del.addEventListener("click", () => {
      if (controller && c.id === currentId) return;
      conversations = conversations.filter((x) => x.id !== c.id);
      if (currentId === c.id) currentId = conversations[0]?.id ?? null;
      save();
      renderAll();
    });
    li.append(open, del);
    ul.appendChild(li);
  }
}

function messageElement(m) {
  const div = document.createElement("div");
  div.className = "msg " + m.role;
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = m.role === "user" ? "You" : "Assistant";
  div.appendChild(role);
  if (m.role === "user") {
    const body = document.createElement("div");
    body.className = "content user-text";
    body.textContent = m.content;
    div.appendChild(body);
    return div;
  }
  const reasoning = document.createElement("details");
  reasoning.className = "reasoning";
  reasoning.innerHTML = "<summary>Reasoning</summary><div class=\"reasoning-text\"></div>";
  const content = document.createElement("div");
  content.className = "content";
  const tools = document.createElement("div");
  tools.className = "tool-calls";
  const meta = document.createElement("div");
  meta.className = "meta";
  div.append(reasoning, content, tools, meta);
  updateMessage(div, m);
  return div;
}

/// Refreshes an assistant message's element from its state.
function updateMessage(div, m) {
  const reasoning = div.querySelector(".reasoning");
  reasoning.hidden = !m.reasoning;
  if (m.reasoning) reasoning.querySelector(".reasoning-text").textContent = m.reasoning;
  renderMarkdown(div.querySelector(".content"), m.content || "");
  const tools = div.querySelector(".tool-calls");
  tools.replaceChildren();
  for (const tc of m.tool_calls || []) {
    const box = document.createElement("div");
    box.className = "tool-call";
    const name = document.createElement("div");
    name.className = "tool-name";
    name.textContent = "Tool call: " + (tc.function?.name || "?");
    const args = document.createElement("pre");
    args.textContent = prettyJson(tc.function?.arguments || "");
    box.append(name, args);
    tools.appendChild(box);
  }
  const meta = div.querySelector(".meta");
  const parts = [];
  if (m.finish === "length") parts.push("⚠ stopped at the token limit (Max tokens)");
  if (m.finish === "stopped") parts.push("■ stopped");
  if (m.stats) parts.push(m.stats);
  meta.textContent = parts.join(" · ");
  meta.classList.toggle("warn", m.finish === "length");
  let err = div.querySelector(".error");
  if (m.error) {
    if (!err) { err = document.createElement("div"); err.className = "error"; div.appendChild(err); }
    err.textContent = m.error;
  } else if (err) {
    err.remove();
  }
}

function prettyJson(s) {
  try { return JSON.stringify(JSON.parse(s), null, 2); } catch { return s; }
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren();
  const c = current();
  if (!c || c.messages.length === 0) {
    const empty = document.createElement("div");
    empty.className = "empty";
    empty.textContent = "Send a message to start.";
    box.appendChild(empty);
    return;
  }
  for (const m of c.messages) box.appendChild(messageElement(m));
  box.scrollTop = box.scrollHeight;
}

function renderAll() {
  renderSidebar();
  renderMessages();
}

function setStatus(text, isError = false) {
  const s = $("status");
  s.textContent = text;
  s.classList.toggle("error", isError);
}

// ------------------------------------------------------------------ settings

function readSettingsForm() {
  for (const f of SETTING_FIELDS) settings[f] = $("set-" + f).value;
  localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));
  $("settings-error").textContent = "";
}

function fillSettingsForm() {
  for (const f of SETTING_FIELDS) $("set-" + f).value = settings[f] ?? "";
}

function authHeaders() {
  const h = { "Content-Type": "application/json" };
  if (settings.api_key) h.Authorization = "Bearer " + settings.api_key;
  return h;
}

/// The request body for conversation `c` (its last message, the reply being
/// generated, excluded). Throws with a message for the user on a bad setting.
function buildRequest(c) {
  const messages = [];
  if (settings.system?.trim()) messages.push({ role: "system", content: settings.system });
  for (const m of c.messages.slice(0, -1)) {
    if (m.role === "user") { messages.push({ role: "user", content: m.content }); continue; }
    if (!m.content && !(m.tool_calls || []).length) continue;  // a failed reply
    const a = { role: "assistant", content: m.content || "" };
    if ((m.tool_calls || []).length) a.tool_calls = m.tool_calls;
    messages.push(a);
  }
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  for (const [f, parse] of Object.entries(NUMBER_FIELDS)) {
    const v = (settings[f] ?? "").toString().trim();
    if (v === "") continue;
    const n = parse(v);
    if (!Number.isFinite(n)) throw new Error(`Settings: ${f} must be a number`);
    body[f] = n;
  }
  if (settings.tools?.trim()) {
    let tools;
    try { tools = JSON.parse(settings.tools); } catch (e) { throw new Error("Settings: Tools is not valid JSON: " + e.message); }
    if (!Array.isArray(tools)) throw new Error("Settings: Tools must be a JSON array");
    body.tools = tools;
  }
  return body;
}

// ------------------------------------------------------------------ generation

async function send() {
  const text = $("input").value;
  if (!text.trim() || controller) return;
  const c = current() || newConversation();
  if (c.messages.length === 0) c.title = text.trim().split("\n")[0].slice(0, 60);
  c.messages.push({ role: "user", content: text });
  const reply = { role: "assistant", content: "", reasoning: "", tool_calls: [] };
  c.messages.push(reply);
  c.updated = Date.now();
  conversations = [c, ...conversations.filter((x) => x.id !== c.id)];
  $("input").value = "";
  save();
  renderAll();
  const div = $("messages").lastElementChild;

  let body;
  try {
    body = buildRequest(c);
  } catch (e) {
    reply.error = e.message;
    updateMessage(div, reply);
    save();
    return;
  }
  setBusy(true);
  controller = new AbortController();
  const t0 = performance.now();
  let tFirst = null;
  let usage = null;
  let pending = false;
  const refresh = () => {  // at most one re-render per frame while tokens arrive
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      const box = $("messages");
      const stick = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
      streamingRender = true;
      updateMessage(div, reply);
      streamingRender = false;
      if (stick) box.scrollTop = box.scrollHeight;
    });
  };
  const onChunk = (chunk) => {
    if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices?.[0];
    if (!choice) return;
    const d = choice.delta || {};
    if (tFirst === null && (d.content || d.reasoning_content || d.tool_calls)) tFirst = performance.now();
    if (d.content) reply.content += d.content;
    if (d.reasoning_content) reply.reasoning += d.reasoning_content;
    for (const tc of d.tool_calls || []) {
      const i = tc.index ?? reply.tool_calls.length;
      const cur = reply.tool_calls[i] || (reply.tool_calls[i] = { id: "", type: "function", function: { name: "", arguments: "" } });
      if (tc.id) cur.id = tc.id;
      if (tc.function?.name) cur.function.name += tc.function.name;
      if (tc.function?.arguments) cur.function.arguments += tc.function.arguments;
    }
    if (choice.finish_reason) reply.finish = choice.finish_reason;
    refresh();
  };
  try {
    const res = await fetch("/v1/chat/completions", { method: "POST", headers: authHeaders(),
                                                       body: JSON.stringify(body), signal: controller.signal });
    if (!res.ok) {
      const err = await res.json().catch(() => null);
      throw new Error(err?.error?.message || `the server answered HTTP ${res.status}`);
    }
    await readEvents(res.body, onChunk);
  } catch (e) {
    if (e.name === "AbortError") reply.finish = "stopped";
    else reply.error = e.message;
  } finally {
    controller = null;
    setBusy(false);
  }
  const tEnd = performance.now();
  if (usage && tFirst !== null) {
    const n = usage.completion_tokens;
    const rate = n > 1 ? ((n - 1) * 1000) / Math.max(tEnd - tFirst, 1) : 0;
    reply.stats = `${n} tokens · ${rate.toFixed(1)} tok/s · first token ${Math.round(tFirst - t0)} ms`;
  }
  updateMessage(div, reply);
  save();
  $("input").focus();
}

/// Calls onChunk with each JSON object of a server-sent-events stream until
/// "data: [DONE]" or the end of the body.
async function readEvents(stream, onChunk) {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onChunk(JSON.parse(data));
      }
    }
  }
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  setStatus(busy ? "generating…" : "");
}

function stop() {
  if (controller) controller.abort();
}

async function showModel() {
  try {
    const res = await fetch("/v1/models", { headers: authHeaders() });
    if (res.status === 401) { $("model-info").textContent = "API key needed (Settings)"; return; }
    const j = await res.json();
    const id = j.data?.[0]?.id;
    $("model-info").textContent = id ? "model: " + id : "";
    if (id) document.title = "quern · " + id;
  } catch {
    $("model-info").textContent = "server unreachable";
  }
}

// ------------------------------------------------------------------ start

function start() {
  load();
  setupMarkdown();
  fillSettingsForm();
  currentId = conversations[0]?.id ?? null;
  renderAll();
  showModel();

  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") stop(); });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", () => {
    if (controller) return;
    newConversation();
    renderAll();
    $("input").focus();
  });
  $("toggle-settings").addEventListener("click", () => {
    const s = $("settings");
    s.hidden = !s.hidden;
    $("toggle-settings").setAttribute("aria-expanded", String(!s.hidden));
  });
  for (const f of SETTING_FIELDS) $("set-" + f).addEventListener("change", () => {
    readSettingsForm();
    if (f === "api_key") showModel();
  });
  $("reset-settings").addEventListener("click", () => {
    const key = settings.api_key;
    settings = { api_key: key };
    fillSettingsForm();
    readSettingsForm();
  });
}

document.addEventListener("DOMContentLoaded", start);
