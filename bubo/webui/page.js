"use strict";
// bubo's chat page: conversations as trees of messages kept in localStorage, answers streamed from
// /v1/chat/completions, Markdown rendered by the server (/webui/render: raw HTML escaped, code
// highlighted). Every text that comes from a person or a model is put in the page as text, or as
// that server-escaped HTML: never as markup of its own.
(function () {
  const CFG = JSON.parse(document.getElementById("bubo-config").textContent);
  const STORE = "bubo.conversations";
  const KEY = "bubo.key";
  const LIMITS = CFG.limits;  // import bounds: bytes, conversations, messages
  const RENDER_EVERY_MS = 1000;  // Markdown of a streaming answer, at most this often
  const SETTINGS = CFG.settings;  // a conversation's settings (bubo/webui/__init__.py: SETTINGS)
  const $ = (id) => document.getElementById(id);

  let convs = {};        // id -> conversation
  let current = null;    // the open conversation's id
  let streaming = null;  // {controller, node} while an answer streams

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

  // --- rendering ---------------------------------------------------------------------------------

  function showError(text) {
    const el = $("error");
    el.textContent = text;
    el.hidden = !text;
  }

  function headers() {
    const h = {"Content-Type": "application/json"};
    const key = localStorage.getItem(KEY);
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  const rendered = new Map();  // text -> html, for the answers on screen

  async function markdown(el, text) {
    if (rendered.has(text)) {
      el.innerHTML = rendered.get(text);  // the server's escaped HTML
      return;
    }
    el.textContent = text;  // until the server's rendering comes (or for good, past its limit)
    if (text.length > CFG.render_max) return;
    try {
      const r = await fetch("/webui/render", {method: "POST", headers: headers(), body: JSON.stringify({text: text})});
      if (!r.ok) return;
      const html = (await r.json()).html;
      if (rendered.size > 500) rendered.clear();
      rendered.set(text, html);
      if (el.dataset.text === text) el.innerHTML = html;
    } catch (e) { /* the text stays */ }
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function button(label, cls, onclick, title) {
    const b = el("button", cls, label);
    b.type = "button";
    if (title) b.title = title;
    b.addEventListener("click", onclick);
    return b;
  }

  function fillBody(box, n, plain) {
    box.replaceChildren();
    if (n.reasoning) {
      const d = el("details", "reasoning");
      d.appendChild(el("summary", null, "Reasoning"));
      d.appendChild(el("pre", null, n.reasoning));
      box.appendChild(d);
    }
    const content = el("div", "content");
    box.appendChild(content);
    if (n.role === "user") {
      content.textContent = n.content;
    } else if (n.content) {
      content.dataset.text = n.content;
      if (plain) content.textContent = n.content; else markdown(content, n.content);
    }
    for (const call of n.tool_calls || []) {
      const t = el("div", "tool-call");
      t.appendChild(el("b", "tool-name", "Tool call: " + call.name));
      t.appendChild(el("pre", "tool-args", call.arguments));
      box.appendChild(t);
    }
    if (n.error) box.appendChild(el("div", "failed", n.error));
  }

  function renderMessage(c, n) {
    const m = el("div", "msg " + n.role);
    m.dataset.id = n.id;
    const body = el("div", "body");
    m.appendChild(body);
    fillBody(body, n);
    const meta = el("div", "meta");
    const sibs = siblings(c, n);
    if (sibs.length > 1) {
      const i = sibs.indexOf(n.id);
      const b = el("span", "branch");
      const prev = button("<", "prev", () => switchTo(c, sibs[i - 1]), "previous version");
      const next = button(">", "next", () => switchTo(c, sibs[i + 1]), "next version");
      prev.disabled = i === 0;
      next.disabled = i === sibs.length - 1;
      b.append(prev, el("span", "count", (i + 1) + "/" + sibs.length), next);
      meta.appendChild(b);
    }
    if (n.role === "user") {
      meta.appendChild(button("Edit", "edit", () => startEdit(c, n, m)));
    } else {
      if (n.stats) meta.appendChild(el("span", "stats", n.stats.tokens + " tokens \u00b7 " + n.stats.tps.toFixed(1) + " tokens/s"));
      meta.appendChild(button("Regenerate", "regen", () => regenerate(c, n)));
    }
    m.appendChild(meta);
    return m;
  }

  function renderConv() {
    const box = $("messages");
    box.replaceChildren();
    const c = conv();
    const s = (c ? c.settings : CFG.defaults) || {};
    for (const k of SETTINGS) {
      const v = s[k];
      $("set-" + k).value = v === undefined || v === null ? "" : (typeof v === "string" ? v : JSON.stringify(v));
    }
    if (!c) return;
    for (const n of path(c)) box.appendChild(renderMessage(c, n));
    box.scrollTop = box.scrollHeight;
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
      li.appendChild(el("span", "title", c.title || "Untitled"));
      li.appendChild(button("\u00d7", "delete", (e) => { e.stopPropagation(); remove(c.id); }, "delete"));
      li.addEventListener("click", () => open(c.id));
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
    renderList();
    renderConv();
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
    setBusy(true);
    renderConv();
    const view = () => document.querySelector('.msg[data-id="' + assistant.id + '"] .body');
    const calls = [];
    let pending = false;
    let rendered_at = 0;
    const paint = () => {
      // the text shows at once; its Markdown (a request to the server) at most once a second
      if (pending) return;
      pending = true;
      setTimeout(() => {
        pending = false;
        if (!streaming || streaming.node !== assistant) return;  // ended: finish() drew it whole
        const v = view();
        if (!v) return;
        const now = Date.now();
        fillBody(v, assistant, now - rendered_at < RENDER_EVERY_MS);
        if (now - rendered_at >= RENDER_EVERY_MS) rendered_at = now;
      }, 80);
    };
    try {
      const r = await fetch("/v1/chat/completions", {method: "POST", headers: headers(), body: JSON.stringify(body),
                                                      signal: controller.signal});
      if (!r.ok) {
        let msg = r.status + " " + r.statusText;
        try { msg = (await r.json()).error.message; } catch (e) { /* keep the status */ }
        if (r.status === 401) msg += " (set the API key in Settings)";
        throw new Error(msg);
      }
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
    finish(c, assistant);
  }

  function finish(c, assistant) {
    streaming = null;
    setBusy(false);
    c.updated = Date.now();
    save();
    renderConv();
    renderList();
    loadModels();  // their status (a model loaded for this answer)
  }

  function send(text) {
    if (streaming || !text.trim()) return;
    showError("");
    let c = conv();
    if (!c) {
      c = newConv();
      current = c.id;
    }
    if (!path(c).length) c.title = text.trim().slice(0, 60);
    const user = addNode(c, c.leaf, {role: "user", content: text});
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
    const box = el("div", "editor");
    const ta = el("textarea", "edit-text");
    ta.value = n.content;
    ta.rows = Math.min(12, n.content.split("\n").length + 1);
    const ok = button("Save and send", "save-edit", () => {
      const user = addNode(c, n.parent, {role: "user", content: ta.value});
      const assistant = addNode(c, user.id, {role: "assistant"});
      save();
      generate(c, assistant);
    });
    const cancel = button("Cancel", "cancel-edit", () => renderConv());
    box.append(ta, ok, cancel);
    body.replaceChildren(box);
    ta.focus();
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

  // --- models ------------------------------------------------------------------------------------

  async function loadModels() {
    const sel = $("model");
    try {
      const r = await fetch("/v1/models", {headers: headers()});
      if (!r.ok) throw new Error(r.status === 401 ? "this server needs an API key: set it in Settings" : "GET /v1/models: " + r.status);
      const data = (await r.json()).data;
      sel.replaceChildren();
      for (const m of data) {
        const o = el("option", null, m.id + (m.status && m.status.value !== "loaded" ? " (" + m.status.value + ")" : ""));
        o.value = m.id;
        sel.appendChild(o);
      }
      const c = conv();
      if (c && c.model && data.some((m) => m.id === c.model)) sel.value = c.model;
    } catch (e) {
      showError(e.message);
    }
  }

  // --- wiring ------------------------------------------------------------------------------------

  function init() {
    load();
    const last = Object.values(convs).sort((a, b) => b.updated - a.updated)[0];
    current = last ? last.id : null;
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = $("input").value;
      $("input").value = "";
      send(text);
    });
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        $("composer").requestSubmit();
      }
    });
    $("stop").addEventListener("click", () => { if (streaming) streaming.controller.abort(); });
    $("new-chat").addEventListener("click", () => {
      if (streaming) return;
      current = newConv().id;
      save();
      renderList();
      renderConv();
      $("input").focus();
    });
    $("search").addEventListener("input", renderList);
    $("export").addEventListener("click", exportAll);
    $("import").addEventListener("change", (e) => { if (e.target.files[0]) importFile(e.target.files[0]); e.target.value = ""; });
    $("model").addEventListener("change", () => { const c = conv(); if (c) { c.model = $("model").value; save(); } });
    for (const k of SETTINGS) {
      $("set-" + k).addEventListener("change", (e) => {
        let c = conv();
        if (!c) { c = newConv(); current = c.id; renderList(); }
        c.settings = c.settings || {};
        c.settings[k] = e.target.value;
        save();
      });
    }
    $("set-key").value = localStorage.getItem(KEY) || "";
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
