"use strict";
// bubo's chat page: conversations as trees of messages kept in localStorage, answers streamed from
// /v1/chat/completions and drawn as Markdown here as they arrive (markdown.js, highlight.js). Every
// text that comes from a person or a model is put in the page as text nodes: never as markup.
(function () {
  const CFG = JSON.parse(document.getElementById("bubo-config").textContent);
  const STORE = "bubo.conversations";
  const KEY = "bubo.key";
  const THEME = "bubo.theme";
  const LIMITS = CFG.limits;  // import bounds: bytes, conversations, messages
  const SETTINGS = CFG.settings;  // a conversation's settings (bubo/webui/__init__.py: SETTINGS)
  const ATTACH_MAX = 512 * 1024;  // the most text one attached file may put in a message
  const FOLLOW_SLACK = 48;  // px from the bottom that still counts as "at the end": the view follows
  const EXAMPLES = ["Explain what a hash table is, with a short Python example.",
                    "Write a haiku about owls.",
                    "What are three tips for writing clear emails?",
                    "Summarise the plot of Romeo and Juliet in two sentences."];
  const $ = (id) => document.getElementById(id);

  let convs = {};        // id -> conversation
  let current = null;    // the open conversation's id
  let streaming = null;  // {controller, node} while an answer streams
  let follow = true;     // the view keeps to the end of a streaming answer until the reader scrolls up
  let attached = [];     // [{name, text}] waiting to go with the next message
  let models = [];       // GET /v1/models's data
  let serverDefaults = {};  // the selected model's sampling defaults (GET /props), for the settings' placeholders

  // --- storage ---------------------------------------------------------------------------------

  function load() {
    try {
      const raw = localStorage.getItem(STORE);
      convs = raw ? JSON.parse(raw) : {};
      if (typeof convs !== "object" || convs === null || Array.isArray(convs)) convs = {};
    } catch (e) {
      convs = {};
      showError("The saved conversations could not be read: " + e.message);
    }
  }

  function save() {
    try {
      localStorage.setItem(STORE, JSON.stringify(convs));
    } catch (e) {
      showError("The conversations could not be saved in this browser (" + e.message + "): export them, then delete some.");
    }
  }

  function uid() {
    return Date.now().toString(36) + Math.random().toString(36).slice(2, 10);
  }

  function isEmpty(c) {
    return !c.roots.length;
  }

  function newConv() {
    const c = {id: uid(), title: "New chat", created: Date.now(), updated: Date.now(), model: $("model").value || null,
               settings: Object.assign({}, CFG.defaults), nodes: {}, roots: [], leaf: null};
    convs[c.id] = c;
    return c;
  }

  function conv() {
    return current ? convs[current] : null;
  }

  // --- the tree --------------------------------------------------------------------------------

  function siblings(c, node) {
    return node.parent ? c.nodes[node.parent].children : c.roots;
  }

  function path(c) {
    const out = [];
    let id = c.leaf;
    while (id) {
      const n = c.nodes[id];
      if (!n) break;
      out.unshift(n);
      id = n.parent;
    }
    return out;
  }

  function addNode(c, parent, fields) {
    const n = Object.assign({id: uid(), parent: parent, children: [], content: "", reasoning: "", tool_calls: []}, fields);
    c.nodes[n.id] = n;
    (parent ? c.nodes[parent].children : c.roots).push(n.id);
    c.leaf = n.id;
    c.updated = Date.now();
    return n;
  }

  function deepest(c, id) {
    // the branch a sibling leads to: follow its last child down
    let n = c.nodes[id];
    while (n.children.length) n = c.nodes[n.children[n.children.length - 1]];
    return n.id;
  }

  // --- small helpers -----------------------------------------------------------------------------

  function showError(text) {
    const e = $("error");
    e.textContent = text;
    e.hidden = !text;
  }

  function headers() {
    const h = {"Content-Type": "application/json"};
    const key = localStorage.getItem(KEY);
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function button(label, cls, onclick, aria) {
    const b = el("button", cls, label);
    b.type = "button";
    if (aria) { b.title = aria; b.setAttribute("aria-label", aria); }
    b.addEventListener("click", onclick);
    return b;
  }

  async function copyText(text, b) {
    let ok = false;
    try {
      await navigator.clipboard.writeText(text);
      ok = true;
    } catch (e) {
      const ta = el("textarea");
      ta.value = text;
      ta.setAttribute("aria-hidden", "true");
      ta.style.position = "fixed";
      ta.style.opacity = "0";
      document.body.appendChild(ta);
      ta.select();
      try { ok = document.execCommand("copy"); } catch (e2) { ok = false; }
      ta.remove();
    }
    if (b) {
      const was = b.textContent;
      b.textContent = ok ? "Copied" : "Copy failed";
      b.dataset.copied = ok ? "1" : "0";
      setTimeout(() => { b.textContent = was; }, 1500);
    }
  }

  // --- the theme and the drawer --------------------------------------------------------------------

  const darkQuery = window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)") : null;

  function applyTheme() {
    const chosen = localStorage.getItem(THEME);
    const dark = chosen ? chosen === "dark" : !!(darkQuery && darkQuery.matches);
    document.documentElement.dataset.theme = dark ? "dark" : "light";
    const t = $("theme");
    t.setAttribute("aria-pressed", dark ? "true" : "false");
    t.title = dark ? "Light theme" : "Dark theme";
  }

  function toggleTheme() {
    localStorage.setItem(THEME, document.documentElement.dataset.theme === "dark" ? "light" : "dark");
    applyTheme();
  }

  const narrow = () => window.matchMedia("(max-width: 760px)").matches;

  function drawer(open) {
    $("sidebar").classList.toggle("open", open);
    $("scrim").hidden = !open;
    $("open-drawer").setAttribute("aria-expanded", open ? "true" : "false");
    if (open) $("new-chat").focus();
  }

  // --- Markdown and code -------------------------------------------------------------------------

  const HOOKS = {
    code(b) {
      const box = el("div", "codeblock");
      const head = el("div", "code-head");
      const lang = b.lang || "text";
      head.appendChild(el("span", "lang", lang));
      const code = el("code", b.lang ? "language-" + b.lang : null);
      head.appendChild(button("Copy", "copy-code", (e) => copyText(code.textContent, e.currentTarget), "Copy the " + lang + " code"));
      const pre = el("pre");
      code.appendChild(BuboHighlight.highlight(b.code, b.lang));
      pre.appendChild(code);
      box.append(head, pre);
      return box;
    },
  };

  function drawContent(content, text) {
    content.dataset.text = text;
    BuboMarkdown.update(content, text, HOOKS);
  }

  // --- drawing -----------------------------------------------------------------------------------

  function fillBody(box, n) {
    // the reasoning, the answer's content (its nodes kept from the last call where its text
    // only grew: Markdown drawn block by block), the calls, the error
    let reasoning = box.querySelector(":scope > details.reasoning");
    if (n.reasoning) {
      if (!reasoning) {
        reasoning = el("details", "reasoning");
        reasoning.appendChild(el("summary", null, "Reasoning"));
        reasoning.appendChild(el("pre"));
        box.prepend(reasoning);
      }
      reasoning.lastChild.textContent = n.reasoning;
    } else if (reasoning) reasoning.remove();
    let content = box.querySelector(":scope > .content");
    if (!content) { content = el("div", "content"); box.appendChild(content); }
    if (n.role === "user") {
      content.textContent = n.content;
    } else {
      drawContent(content, n.content || "");
    }
    for (const old of box.querySelectorAll(":scope > .tool-call, :scope > .failed, :scope > .waiting")) old.remove();
    for (const call of n.tool_calls || []) {
      const t = el("div", "tool-call");
      t.appendChild(el("b", "tool-name", "Tool call: " + call.name));
      t.appendChild(el("pre", "tool-args", call.arguments));
      box.appendChild(t);
    }
    if (n.waiting && !n.content && !n.reasoning) box.appendChild(el("div", "waiting", n.waiting));
    if (n.error) box.appendChild(el("div", "failed", n.error));
  }

  function renderMessage(c, n) {
    const m = el("article", "msg " + n.role);
    m.dataset.id = n.id;
    m.setAttribute("aria-label", n.role === "user" ? "Your message" : "Answer");
    const body = el("div", "body");
    m.appendChild(body);
    fillBody(body, n);
    const meta = el("div", "meta");
    const sibs = siblings(c, n);
    if (sibs.length > 1) {
      const i = sibs.indexOf(n.id);
      const b = el("span", "branch");
      const prev = button("\u2039", "prev", () => switchTo(c, sibs[i - 1]), "Previous version");
      const next = button("\u203a", "next", () => switchTo(c, sibs[i + 1]), "Next version");
      prev.disabled = i === 0;
      next.disabled = i === sibs.length - 1;
      b.append(prev, el("span", "count", (i + 1) + "/" + sibs.length), next);
      meta.appendChild(b);
    }
    if (n.role === "user") {
      meta.appendChild(button("Edit", "edit", () => startEdit(c, n, m), "Edit this message"));
    } else if (!(streaming && streaming.node === n)) {  // an answer still coming has nothing to copy or redo yet
      if (n.stats) meta.appendChild(el("span", "stats", n.stats.tokens + " tokens \u00b7 " + n.stats.tps.toFixed(1) + " tokens/s"));
      meta.appendChild(button("Copy", "copy-answer", (e) => copyText(n.content || "", e.currentTarget), "Copy the answer"));
      meta.appendChild(button("Regenerate", "regen", () => regenerate(c, n), "Regenerate the answer"));
    }
    m.appendChild(meta);
    return m;
  }

  function modelLabel() {
    const sel = $("model");
    return sel.value || (models[0] && models[0].id) || "the model";
  }

  function renderEmpty(show) {
    $("empty").hidden = !show;
    if (!show) return;
    $("empty-model").textContent = "Talking to " + modelLabel() + ". Ask anything, or start from an example:";
    const box = $("examples");
    if (!box.children.length) {
      for (const text of EXAMPLES) box.appendChild(button(text, "example", () => { if (!streaming) send(text); }));
    }
  }

  function renderConv() {
    const box = $("messages");
    box.replaceChildren();
    const c = conv();
    renderEmpty(!c || isEmpty(c));
    if (!c) return;
    for (const n of path(c)) box.appendChild(renderMessage(c, n));
    scrollToEnd();
    if (c.model && [...$("model").options].some((o) => o.value === c.model)) $("model").value = c.model;
  }

  function renderList() {
    const q = $("search").value.trim().toLowerCase();
    const list = $("conv-list");
    list.replaceChildren();
    const all = Object.values(convs).sort((a, b) => b.updated - a.updated);
    for (const c of all) {
      if (q && !matches(c, q)) continue;
      const li = el("li", c.id === current ? "active" : "");
      li.dataset.id = c.id;
      const t = button(c.title || "Untitled", "title", () => open(c.id));
      if (c.id === current) t.setAttribute("aria-current", "true");
      li.appendChild(t);
      li.appendChild(button("\u00d7", "delete", (e) => { e.stopPropagation(); remove(c.id); },
                            "Delete the conversation " + (c.title || "Untitled")));
      list.appendChild(li);
    }
  }

  function matches(c, q) {
    if ((c.title || "").toLowerCase().includes(q)) return true;
    return Object.values(c.nodes).some((n) => (n.content || "").toLowerCase().includes(q));
  }

  function open(id) {
    if (streaming) return;
    current = id;
    follow = true;
    renderList();
    renderConv();
    if (narrow()) drawer(false);
  }

  function remove(id) {
    if (streaming && current === id) return;
    delete convs[id];
    if (current === id) current = null;
    save();
    renderList();
    renderConv();
  }

  function switchTo(c, id) {
    if (streaming || !id) return;
    c.leaf = deepest(c, id);
    save();
    renderConv();
  }

  // --- following the answer ----------------------------------------------------------------------

  function atEnd() {
    const s = $("scroller");
    return s.scrollHeight - s.scrollTop - s.clientHeight <= FOLLOW_SLACK;
  }

  function scrollToEnd() {
    const s = $("scroller");
    s.scrollTop = s.scrollHeight;
    $("jump").hidden = true;
  }

  function onScroll() {
    if (!streaming) { $("jump").hidden = atEnd(); return; }
    follow = atEnd();
    $("jump").hidden = follow;
  }

  function afterPaint() {
    if (follow) scrollToEnd(); else $("jump").hidden = false;
  }

  // --- asking the server -------------------------------------------------------------------------

  function number(v, name) {
    if (v === "" || v === null || v === undefined) return undefined;
    const x = Number(v);
    if (!Number.isFinite(x)) throw new Error(name + " must be a number");
    return x;
  }

  function requestBody(c, upTo) {
    const s = c.settings || {};
    const messages = [];
    if (s.system) messages.push({role: "system", content: s.system});
    for (const n of upTo) messages.push({role: n.role, content: n.content});
    const body = {model: c.model || $("model").value || "bubo", messages: messages, stream: true,
                  stream_options: {include_usage: true}};
    for (const k of ["temperature", "top_p", "top_k", "min_p", "seed"]) {
      const v = number(s[k], k);
      if (v !== undefined) body[k] = v;
    }
    const mt = number(s.max_tokens, "max_tokens");
    if (mt !== undefined) body.max_tokens = mt;
    if (s.json_schema && String(s.json_schema).trim()) {
      let schema;
      try { schema = JSON.parse(s.json_schema); } catch (e) { throw new Error("The JSON schema setting is not JSON: " + e.message); }
      body.response_format = {type: "json_schema", json_schema: {name: "answer", schema: schema}};
    }
    if (s.tools && String(s.tools).trim()) {
      try { body.tools = JSON.parse(s.tools); } catch (e) { throw new Error("The tools setting is not JSON: " + e.message); }
    }
    return body;
  }

  function setBusy(on) {
    document.body.dataset.busy = on ? "1" : "0";
    $("send").hidden = on;
    $("stop").hidden = !on;
  }

  const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

  function statusOf(name) {
    const m = models.find((x) => x.id === name || (x.aliases || []).includes(name));
    return m && m.status ? m.status.value : null;
  }

  // POST /v1/chat/completions; while the model loads (503 not_ready, or a request that waits on a
  // load), the answer says so, and the request is tried again until the model is ready
  async function post(body, assistant, signal, repaint) {
    for (let attempt = 0; ; attempt++) {
      const poll = setInterval(async () => {
        await loadModels();
        const state = statusOf(body.model);
        const was = assistant.waiting;
        assistant.waiting = state === "loading" ? "Loading " + body.model : "Thinking";
        if (assistant.waiting !== was) repaint();
      }, 700);
      let r;
      try {
        r = await fetch("/v1/chat/completions", {method: "POST", headers: headers(), body: JSON.stringify(body), signal: signal});
      } finally {
        clearInterval(poll);
      }
      if (r.status === 503 && attempt < 300) {
        let err = {};
        try { err = (await r.json()).error || {}; } catch (e) { /* keep trying */ }
        if (err.code === "not_ready") {
          assistant.waiting = "Loading " + body.model;
          repaint();
          loadModels();
          await sleep(1000 * Math.min(Number(r.headers.get("Retry-After")) || 1, 2));
          continue;
        }
        throw new Error(err.message || "503 " + r.statusText);
      }
      if (!r.ok) {
        let msg = r.status + " " + r.statusText;
        try { msg = (await r.json()).error.message; } catch (e) { /* keep the status */ }
        if (r.status === 401) msg += " (set the API key in Settings)";
        throw new Error(msg);
      }
      return r;
    }
  }

  async function generate(c, assistant) {
    const upTo = path(c).filter((n) => n.id !== assistant.id);
    let body;
    try { body = requestBody(c, upTo); } catch (e) {
      assistant.error = e.message;
      finish(c, assistant);
      return;
    }
    const controller = new AbortController();
    streaming = {controller: controller, node: assistant};
    follow = true;
    setBusy(true);
    assistant.waiting = statusOf(body.model) === "loading" ? "Loading " + body.model : "Thinking";
    renderConv();
    const view = () => document.querySelector('.msg[data-id="' + assistant.id + '"] .body');
    const calls = [];
    let pending = false;
    const paint = () => {
      // at most once per frame: the Markdown of the blocks that changed, then the view follows
      if (pending) return;
      pending = true;
      requestAnimationFrame(() => {
        pending = false;
        if (!streaming || streaming.node !== assistant) return;  // ended: finish() drew it whole
        const v = view();
        if (v) fillBody(v, assistant);
        afterPaint();
      });
    };
    try {
      const r = await post(body, assistant, controller.signal, paint);
      assistant.waiting = null;
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buf += decoder.decode(value, {stream: true});
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          for (const line of block.split("\n")) {
            if (!line.startsWith("data: ")) continue;
            const data = line.slice(6);
            if (data === "[DONE]") continue;
            const ev = JSON.parse(data);
            if (ev.error) throw new Error(ev.error.message || "the answer failed");
            const ch = (ev.choices || [])[0];
            if (ch && ch.delta) {
              if (ch.delta.content) assistant.content += ch.delta.content;
              if (ch.delta.reasoning_content) assistant.reasoning += ch.delta.reasoning_content;
              for (const tc of ch.delta.tool_calls || []) {
                const slot = calls[tc.index] || (calls[tc.index] = {name: "", arguments: ""});
                if (tc.function && tc.function.name) slot.name += tc.function.name;
                if (tc.function && tc.function.arguments) slot.arguments += tc.function.arguments;
              }
              assistant.tool_calls = calls.filter(Boolean);
            }
            if (ev.timings && ev.timings.predicted_n !== undefined) {
              assistant.stats = {tokens: ev.timings.predicted_n, tps: ev.timings.predicted_per_second || 0};
            }
            paint();
          }
        }
      }
    } catch (e) {
      if (e.name === "AbortError") assistant.error = "Stopped.";
      else assistant.error = e.message;
    }
    assistant.waiting = null;
    finish(c, assistant);
  }

  function finish(c, assistant) {
    streaming = null;
    setBusy(false);
    c.updated = Date.now();
    save();
    const keep = follow;
    const top = $("scroller").scrollTop;
    renderConv();
    if (!keep) { $("scroller").scrollTop = top; $("jump").hidden = atEnd(); }  // the reader stays where they were
    renderList();
    loadModels();  // their status (a model loaded for this answer)
  }

  // --- attachments -----------------------------------------------------------------------------

  const FENCE_LANG = {py: "python", js: "javascript", ts: "typescript", sh: "bash", md: "markdown", rb: "ruby",
                      rs: "rust", yml: "yaml", h: "c", hpp: "cpp", cc: "cpp"};

  function fenced(file) {
    // the file as a fenced block under its name, the fence longer than any run of backticks in it
    const ext = (file.name.split(".").pop() || "").toLowerCase();
    const lang = FENCE_LANG[ext] || (/^[a-z0-9+#-]{1,12}$/.test(ext) && ext !== file.name.toLowerCase() ? ext : "");
    const longest = Math.max(2, ...(file.text.match(/`+/g) || []).map((r) => r.length));
    const fence = "`".repeat(longest + 1);
    return file.name + ":\n" + fence + lang + "\n" + file.text.replace(/\n$/, "") + "\n" + fence;
  }

  function renderAttachments() {
    const box = $("attachments");
    box.replaceChildren();
    attached.forEach((f, i) => {
      const chip = el("span", "chip");
      chip.appendChild(el("span", null, f.name + " (" + Math.ceil(f.text.length / 1024) + " KB)"));
      chip.appendChild(button("\u00d7", "remove-file", () => { attached.splice(i, 1); renderAttachments(); },
                              "Remove " + f.name));
      box.appendChild(chip);
    });
  }

  async function attach(files) {
    for (const file of files) {
      if (file.size > ATTACH_MAX) { showError(file.name + " is " + file.size + " bytes: a message takes files of up to " + ATTACH_MAX + " bytes"); continue; }
      const text = await file.text();
      if (text.includes("\u0000") || text.includes("\ufffd")) { showError(file.name + " is not a text file: attach text (.txt, .md, .py, ...)"); continue; }
      attached.push({name: file.name, text: text});
    }
    renderAttachments();
  }

  function send(text) {
    if (streaming) return;
    const files = attached.map(fenced);
    const full = [text.trim() ? text : "", ...files].filter(Boolean).join("\n\n");
    if (!full.trim()) return;
    showError("");
    attached = [];
    renderAttachments();
    let c = conv();
    if (!c) {
      c = newConv();
      current = c.id;
    }
    if (!path(c).length) c.title = (text.trim() || files[0] || "").split("\n")[0].slice(0, 60);
    const user = addNode(c, c.leaf, {role: "user", content: full});
    const assistant = addNode(c, user.id, {role: "assistant"});
    save();
    renderList();
    generate(c, assistant);
  }

  function regenerate(c, n) {
    if (streaming) return;
    const assistant = addNode(c, n.parent, {role: "assistant"});
    save();
    generate(c, assistant);
  }

  function startEdit(c, n, m) {
    if (streaming) return;
    const body = m.querySelector(".body");
    m.classList.add("editing");
    const box = el("div", "editor");
    const ta = el("textarea", "edit-text");
    ta.setAttribute("aria-label", "Edit the message");
    ta.value = n.content;
    ta.rows = Math.min(16, n.content.split("\n").length + 2);
    const submit = () => {
      const user = addNode(c, n.parent, {role: "user", content: ta.value});
      const assistant = addNode(c, user.id, {role: "assistant"});
      save();
      generate(c, assistant);
    };
    ta.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
      if (e.key === "Escape") { e.preventDefault(); renderConv(); }
    });
    const actions = el("div", "actions");
    actions.append(button("Cancel", "cancel-edit", () => renderConv()), button("Save and send", "save-edit primary", submit));
    box.append(ta, actions);
    body.replaceChildren(box);
    ta.focus();
  }
  // --- settings ------------------------------------------------------------------------------------

  // what an empty field means: the server's --ui-config default, else the model's (GET /props)
  function effective(k) {
    if (CFG.defaults[k] !== undefined && CFG.defaults[k] !== null && CFG.defaults[k] !== "") return String(CFG.defaults[k]);
    const p = serverDefaults;
    if (k === "max_tokens") return p.n_predict === undefined ? "" : (p.n_predict < 0 ? "no limit" : String(p.n_predict));
    if (k === "seed") return p.seed === undefined || p.seed === 4294967295 || p.seed < 0 ? "random" : String(p.seed);
    if (k === "system") return "none";
    if (k === "json_schema") return "none: free text";
    if (k === "tools") return "none";
    return p[k] === undefined ? "" : String(Math.round(p[k] * 1000) / 1000);
  }

  function fillSettings() {
    const c = conv();
    const s = (c ? c.settings : CFG.defaults) || {};
    for (const k of SETTINGS) {
      const v = s[k];
      const f = $("set-" + k);
      f.value = v === undefined || v === null ? "" : (typeof v === "string" ? v : JSON.stringify(v));
      const d = effective(k);
      f.placeholder = d ? "default: " + d : "";
      f.title = CFG.defaults[k] !== undefined ? "this server's default for new conversations" : "the model's default";
    }
    $("set-key").value = localStorage.getItem(KEY) || "";
    $("set-key").placeholder = "only if the server has one";
  }

  async function loadDefaults() {
    try {
      const name = $("model").value;
      const r = await fetch("/props" + (name ? "?model=" + encodeURIComponent(name) : ""), {headers: headers()});
      if (!r.ok) return;
      const p = (await r.json()).default_generation_settings || {};
      serverDefaults = Object.assign({n_predict: p.n_predict}, p.params || {});
    } catch (e) { /* the placeholders stay as they are */ }
  }

  async function openSettings() {
    await loadDefaults();
    fillSettings();
    $("settings").showModal();
  }

  // --- models ------------------------------------------------------------------------------------

  async function loadModels() {
    const sel = $("model");
    try {
      const r = await fetch("/v1/models", {headers: headers()});
      if (!r.ok) throw new Error(r.status === 401 ? "this server needs an API key: set it in Settings" : "GET /v1/models: " + r.status);
      models = (await r.json()).data;
      const keep = sel.value;
      sel.replaceChildren();
      for (const m of models) {
        const state = m.status ? m.status.value : "loaded";
        const o = el("option", null, m.id + (state !== "loaded" ? " (" + state + ")" : ""));
        o.value = m.id;
        sel.appendChild(o);
      }
      const c = conv();
      if (c && c.model && models.some((m) => m.id === c.model)) sel.value = c.model;
      else if (keep && models.some((m) => m.id === keep)) sel.value = keep;
      showModelState();
      if ($("error").textContent.includes("API key")) showError("");
    } catch (e) {
      showError(e.message);
    }
  }

  function showModelState() {
    const state = statusOf($("model").value);
    const s = $("model-state");
    const words = {loading: "loading\u2026", failed: "failed to load", sleeping: "asleep: loads on the next message",
                   unloaded: "loads on the first message", unloading: "unloading\u2026"};
    s.textContent = words[state] || "";
    s.className = state === "loading" || state === "unloading" ? "loading" : "";
    if (state === "failed") {
      const m = models.find((x) => x.id === $("model").value);
      s.title = (m && m.status && m.status.error) || "";
    }
    renderEmpty(!conv() || isEmpty(conv()));
    if (state === "loading" || state === "unloading") setTimeout(() => { if (!streaming) loadModels(); }, 1000);
  }
  // --- import and export -------------------------------------------------------------------------

  function exportAll() {
    const blob = new Blob([JSON.stringify({format: "bubo-conversations", version: 1, conversations: Object.values(convs)}, null, 1)],
                          {type: "application/json"});
    const a = el("a");
    a.href = URL.createObjectURL(blob);
    a.download = "bubo-conversations.json";
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  }

  const own = (o, k) => Object.prototype.hasOwnProperty.call(o, k);

  function checkConv(c, i) {
    // an imported conversation must be a tree: every link present and agreeing, no cycle, the
    // fields the page reads of the types it reads them as (else the page could not show it)
    const where = "conversation " + (i + 1);
    if (typeof c !== "object" || c === null || typeof c.nodes !== "object" || c.nodes === null || !Array.isArray(c.roots))
      throw new Error(where + " is not a conversation (it needs nodes and roots)");
    const nodes = c.nodes;
    for (const id of Object.keys(nodes)) {
      const n = nodes[id];
      if (typeof n !== "object" || n === null || n.id !== id || !["user", "assistant"].includes(n.role) ||
          typeof n.content !== "string" || !Array.isArray(n.children))
        throw new Error(where + ": message " + id + " is malformed");
      if (n.parent !== null && n.parent !== undefined && !(typeof n.parent === "string" && own(nodes, n.parent) &&
                                                           nodes[n.parent].children.includes(id)))
        throw new Error(where + ": message " + id + " has a parent that is not there");
      for (const ch of n.children) {
        if (typeof ch !== "string" || !own(nodes, ch) || nodes[ch].parent !== id)
          throw new Error(where + ": message " + id + " has a child that is not there");
      }
      for (const k of ["reasoning", "error"]) {
        if (n[k] !== undefined && n[k] !== null && typeof n[k] !== "string") throw new Error(where + ": message " + id + " has a bad " + k);
      }
      if (n.tool_calls !== undefined && !(Array.isArray(n.tool_calls) && n.tool_calls.every(
          (t) => t && typeof t.name === "string" && typeof t.arguments === "string")))
        throw new Error(where + ": message " + id + " has bad tool_calls");
      if (n.stats !== undefined && !(n.stats && Number.isFinite(n.stats.tokens) && Number.isFinite(n.stats.tps)))
        throw new Error(where + ": message " + id + " has bad stats");
    }
    for (const r of c.roots) {
      if (typeof r !== "string" || !own(nodes, r) || (nodes[r].parent !== null && nodes[r].parent !== undefined))
        throw new Error(where + ": a root message is not there");
    }
    // every message reached once from the roots: no cycle, nothing detached
    const seen = new Set();
    const stack = [...c.roots];
    while (stack.length) {
      const id = stack.pop();
      if (seen.has(id)) throw new Error(where + ": message " + id + " is reached twice");
      seen.add(id);
      stack.push(...nodes[id].children);
    }
    if (seen.size !== Object.keys(nodes).length) throw new Error(where + ": some messages are not reached from its roots");
    if (c.leaf !== null && c.leaf !== undefined && !(typeof c.leaf === "string" && own(nodes, c.leaf)))
      throw new Error(where + ": its current message is not there");
  }

  async function importFile(file) {
    showError("");
    try {
      if (file.size > LIMITS.bytes) throw new Error("the file is " + file.size + " bytes; an import takes at most " + LIMITS.bytes);
      const data = JSON.parse(await file.text());
      const list = Array.isArray(data) ? data : data && data.conversations;
      if (!Array.isArray(list)) throw new Error("expected {\"conversations\": [...]} as Export writes it");
      if (list.length > LIMITS.conversations) throw new Error(list.length + " conversations; an import takes at most " + LIMITS.conversations);
      let messages = 0;
      list.forEach((c, i) => { checkConv(c, i); messages += Object.keys(c.nodes).length; });
      if (messages > LIMITS.messages) throw new Error(messages + " messages; an import takes at most " + LIMITS.messages);
      for (const c of list) {
        const copy = Object.assign({}, c, {id: convs[c.id] ? uid() : (typeof c.id === "string" && c.id ? c.id : uid()),
                                           title: String(c.title || "Imported chat"), settings: c.settings || {},
                                           created: Number(c.created) || Date.now(), updated: Number(c.updated) || Date.now()});
        convs[copy.id] = copy;
      }
      save();
      renderList();
    } catch (e) {
      showError("Import failed: " + e.message);
    }
  }


  // --- wiring ------------------------------------------------------------------------------------

  function startNewChat() {
    if (streaming) return;
    // an empty conversation is reused, not added again
    const empty = Object.values(convs).find(isEmpty);
    current = empty ? empty.id : newConv().id;
    if (empty) { empty.model = $("model").value || empty.model; empty.updated = Date.now(); }
    save();
    renderList();
    renderConv();
    if (narrow()) drawer(false);
    $("input").focus();
  }

  // While the user types, the conversation so far is read into the server's cache (POST
  // /v1/prefill, 600 ms after the last keystroke): the answer then reads only what is new. The
  // body is the one send() will make; the server stops a prefill as soon as a request comes.
  let prefillTimer = null;
  function prefillSoon() {
    clearTimeout(prefillTimer);
    prefillTimer = setTimeout(() => {
      const text = $("input").value;
      if (streaming || text.trim().split(/\s+/).length < 3) return;
      const c = conv() || {model: $("model").value || null, settings: Object.assign({}, CFG.defaults), leaf: null};
      const full = [text, ...attached.map(fenced)].filter(Boolean).join("\n\n");
      let body;
      try { body = requestBody(c, [...(c.leaf ? path(c) : []), {role: "user", content: full}]); } catch (e) { return; }
      fetch("/v1/prefill", {method: "POST", headers: headers(), body: JSON.stringify(body)}).catch(() => {});
    }, 600);
  }

  function grow() {
    const t = $("input");
    t.style.height = "auto";
    const most = window.innerHeight * 0.4;
    t.style.height = Math.min(t.scrollHeight + 2, most) + "px";
    t.style.overflowY = t.scrollHeight + 2 > most ? "auto" : "hidden";
  }

  function init() {
    applyTheme();
    if (darkQuery && darkQuery.addEventListener) darkQuery.addEventListener("change", applyTheme);
    load();
    const last = Object.values(convs).sort((a, b) => b.updated - a.updated)[0];
    current = last ? last.id : null;
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = $("input").value;
      if (!text.trim() && !attached.length) return;
      $("input").value = "";
      grow();
      send(text);
    });
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        $("composer").requestSubmit();
      }
    });
    $("input").addEventListener("input", grow);
    $("input").addEventListener("input", prefillSoon);
    document.addEventListener("keydown", (e) => {
      if (e.key !== "Escape") return;
      if (streaming) { e.preventDefault(); streaming.controller.abort(); }
      else if ($("sidebar").classList.contains("open")) { drawer(false); $("open-drawer").focus(); }
    });
    $("stop").addEventListener("click", () => { if (streaming) streaming.controller.abort(); });
    $("new-chat").addEventListener("click", startNewChat);
    $("search").addEventListener("input", renderList);
    $("export").addEventListener("click", exportAll);
    $("import-button").addEventListener("click", () => $("import").click());
    $("import").addEventListener("change", (e) => { if (e.target.files[0]) importFile(e.target.files[0]); e.target.value = ""; });
    $("attach-button").addEventListener("click", () => $("attach").click());
    $("attach").addEventListener("change", (e) => { attach([...e.target.files]); e.target.value = ""; });
    const composer = $("composer");
    composer.addEventListener("dragover", (e) => { e.preventDefault(); composer.classList.add("dragging"); });
    composer.addEventListener("dragleave", () => composer.classList.remove("dragging"));
    composer.addEventListener("drop", (e) => {
      e.preventDefault();
      composer.classList.remove("dragging");
      if (e.dataTransfer && e.dataTransfer.files.length) attach([...e.dataTransfer.files]);
    });
    $("model").addEventListener("change", () => {
      const c = conv();
      if (c) { c.model = $("model").value; save(); }
      showModelState();
    });
    $("theme").addEventListener("click", toggleTheme);
    $("open-drawer").addEventListener("click", () => drawer(true));
    $("close-drawer").addEventListener("click", () => { drawer(false); $("open-drawer").focus(); });
    $("scrim").addEventListener("click", () => drawer(false));
    $("scroller").addEventListener("scroll", onScroll, {passive: true});
    $("jump").addEventListener("click", () => { follow = true; scrollToEnd(); });
    $("open-settings").addEventListener("click", openSettings);
    for (const k of SETTINGS) {
      $("set-" + k).addEventListener("change", (e) => {
        let c = conv();
        if (!c) { c = newConv(); current = c.id; renderList(); }
        c.settings = c.settings || {};
        c.settings[k] = e.target.value;
        save();
      });
    }
    $("set-key").addEventListener("change", (e) => {
      if (e.target.value) localStorage.setItem(KEY, e.target.value); else localStorage.removeItem(KEY);
      loadModels();
    });
    renderList();
    renderConv();
    loadModels().then(renderConv);
  }

  init();
})();
