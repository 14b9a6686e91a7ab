"use strict";
// Markdown for the chat page, rendered in the browser as an answer streams: the text is cut into
// blocks (paragraphs, headings, fenced code, lists, quotes, tables, rules); a block whose source
// did not change keeps its nodes, so what was rendered stays rendered and only the growing last
// block is drawn again. Every node is made with createElement and textContent: no text from a
// model or a person is ever parsed as HTML. Links go out only to http(s) and mailto addresses.
const BuboMarkdown = (function () {
  const FENCE = /^( {0,3})(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
  const HEADING = /^ {0,3}(#{1,6})(?:\s+(.*?))?\s*#*\s*$/;
  const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
  const QUOTE = /^ {0,3}> ?/;
  const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])(\s+|$)(.*)$/;
  const TABLE_SEP = /^\s*\|?\s*:?-{1,}:?\s*(\|\s*:?-{1,}:?\s*)*\|?\s*$/;
  const MAX_DEPTH = 16;  // quotes, lists and emphasis nested deeper than this are drawn as text

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // --- blocks ---------------------------------------------------------------------------------

  // [{type, src, ...}]: src is the block's own text (what decides whether it must be drawn again)
  function blocks(text) {
    const lines = text.split("\n");
    const out = [];
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (!line.trim()) { i++; continue; }
      let m;
      if ((m = FENCE.exec(line))) {
        const indent = m[1].length, marker = m[2], lang = m[3].toLowerCase();
        const body = [];
        let j = i + 1, closed = false;
        for (; j < lines.length; j++) {
          const t = lines[j];
          if (t.trim().startsWith(marker[0].repeat(marker.length)) && !t.trim().replace(new RegExp("^\\" + marker[0] + "+"), "").trim()) {
            closed = true;
            break;
          }
          body.push(indent ? t.replace(new RegExp("^ {0," + indent + "}"), "") : t);
        }
        out.push({type: "code", lang: lang, code: body.join("\n"), closed: closed, src: lines.slice(i, j + 1).join("\n")});
        i = closed ? j + 1 : j;
        continue;
      }
      if ((m = HEADING.exec(line))) {
        out.push({type: "heading", level: m[1].length, text: m[2] || "", src: line});
        i++;
        continue;
      }
      if (RULE.test(line)) {
        out.push({type: "rule", src: line});
        i++;
        continue;
      }
      if (QUOTE.test(line)) {
        const body = [];
        let j = i;
        for (; j < lines.length && lines[j].trim() && (QUOTE.test(lines[j]) || body.length); j++) {
          if (!QUOTE.test(lines[j]) && (ITEM.test(lines[j]) || FENCE.test(lines[j]))) break;
          body.push(lines[j].replace(QUOTE, ""));
        }
        out.push({type: "quote", text: body.join("\n"), src: lines.slice(i, j).join("\n")});
        i = j;
        continue;
      }
      if (ITEM.test(line)) {
        const j = listEnd(lines, i);
        const src = lines.slice(i, j).join("\n");
        out.push(Object.assign({type: "list", src: src}, listItems(lines.slice(i, j))));
        i = j;
        continue;
      }
      if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes("-")) {
        let j = i + 2;
        while (j < lines.length && lines[j].trim() && lines[j].includes("|")) j++;
        out.push({type: "table", rows: lines.slice(i, j).filter((_, k) => k !== 1).map(cells),
                  align: cells(lines[i + 1]).map((c) => c.endsWith(":") ? (c.startsWith(":") ? "center" : "right") : ""),
                  src: lines.slice(i, j).join("\n")});
        i = j;
        continue;
      }
      // a paragraph: until a blank line or the start of another kind of block
      let j = i + 1;
      while (j < lines.length && lines[j].trim() && !FENCE.test(lines[j]) && !HEADING.test(lines[j]) &&
             !RULE.test(lines[j]) && !QUOTE.test(lines[j]) && !ITEM.test(lines[j])) j++;
      out.push({type: "para", text: lines.slice(i, j).join("\n"), src: lines.slice(i, j).join("\n")});
      i = j;
    }
    return out;
  }

  function cells(row) {
    let r = row.trim();
    if (r.startsWith("|")) r = r.slice(1);
    if (r.endsWith("|") && !r.endsWith("\\|")) r = r.slice(0, -1);
    return r.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
  }

  // where a list that starts at line i ends: a blank line followed by something not indented
  // under it, or a line that is neither an item, indented, nor a lazy continuation of one
  function listEnd(lines, i) {
    let j = i + 1;
    while (j < lines.length) {
      const t = lines[j];
      if (!t.trim()) {
        const next = lines[j + 1];
        if (next !== undefined && next.trim() && (ITEM.test(next) || /^\s{2,}/.test(next))) { j++; continue; }
        break;
      }
      if (ITEM.test(t) || /^\s{2,}/.test(t)) { j++; continue; }
      if (FENCE.test(t) || HEADING.test(t) || RULE.test(t) || QUOTE.test(t)) break;
      j++;  // a lazy continuation of the item's text
    }
    return j;
  }

  // {ordered, start, items: [text of each item, its own lines unindented]}
  function listItems(lines) {
    const first = ITEM.exec(lines[0]);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const items = [];
    let cur = null, width = 0;
    for (const line of lines) {
      const m = ITEM.exec(line);
      if (m && m[1].length <= indent + 1 && /\d/.test(m[2]) === ordered) {
        cur = [m[4]];
        width = m[1].length + m[2].length + Math.max(1, Math.min(m[3].length, 4));
        items.push(cur);
      } else if (cur) {
        cur.push(line.replace(new RegExp("^ {0," + width + "}"), ""));
      }
    }
    return {ordered: ordered, start: ordered ? parseInt(first[2], 10) : 1,
            items: items.map((it) => it.join("\n").replace(/\n+$/, ""))};
  }

  // --- inline ------------------------------------------------------------------------------------

  const SAFE_URL = /^(https?:\/\/|mailto:)/i;
  const LINK = /\[([^\]\n]{1,500})\]\(\s*<?([^)\s>]{1,2000})>?(?:\s+"[^"\n]{0,200}")?\s*\)/y;
  const BARE = /https?:\/\/[^\s<>"'`]{1,2000}/iy;
  const TICKS = /`+/y;
  const REACH = 1000;  // how far an emphasis looks for its closing mark: every search is bounded

  // finder(mark, from, valid): the first p >= from where mark is and valid(p) holds (-1: none).
  // Whether a mark can close depends on the mark's own place, not on the opening, so each
  // mark's answer is kept and a later opening (they come in order) scans only past it: a text
  // is scanned about once per mark, however many openings fail to close.
  function closers(text) {
    const memo = new Map();
    return function (mark, from, valid) {
      const m = memo.get(mark);
      if (m && from >= m.from && (m.at < 0 || from <= m.at)) return m.at;
      let p = text.indexOf(mark, from);
      while (p >= 0 && !valid(p)) p = text.indexOf(mark, p + 1);
      memo.set(mark, {from: from, at: p});
      return p;
    };
  }

  // an opening at i closes at end: near enough, and on the same line
  const near = (text, i, end) => end > i && end - i <= REACH && text.lastIndexOf("\n", end) < i;

  // text with **strong**, *em*, ~~del~~, `code`, [links](url), bare URLs and line breaks, as nodes
  function inline(text, parent, depth) {
    depth = depth || 0;
    if (depth > MAX_DEPTH) { parent.appendChild(document.createTextNode(text)); return parent; }
    let i = 0, plain = "";
    const flush = () => { if (plain) { parent.appendChild(document.createTextNode(plain)); plain = ""; } };
    const at = (re) => { re.lastIndex = i; return re.exec(text); };
    const find = closers(text);
    while (i < text.length) {
      const c = text[i];
      if (c === "\\" && i + 1 < text.length && /[\\`*_{}[\]()#+\-.!|~<>]/.test(text[i + 1])) {
        plain += text[i + 1];
        i += 2;
        continue;
      }
      if (c === "\n") {
        flush();
        parent.appendChild(el("br"));
        i++;
        continue;
      }
      if (c === "`") {
        const run = at(TICKS)[0];
        const end = find(run, i + run.length, (p) => text[p - 1] !== "`" && text[p + run.length] !== "`");
        if (end > 0 && end - i < 20 * REACH) {
          flush();
          parent.appendChild(el("code", null, text.slice(i + run.length, end).replace(/^ (.+) $/, "$1")));
          i = end + run.length;
          continue;
        }
        plain += run;
        i += run.length;
        continue;
      }
      if ((c === "*" || c === "_" || c === "~") && text[i + 1] === c) {
        const mark = c + c;
        // opens where it does not follow a space (nor, for "__", a letter); closes where it follows
        // no space (and, for "__", is followed by no letter)
        const end = text[i + 2] !== " " && (c !== "_" || !/\w/.test(text[i - 1] || "")) ?
          find(mark, i + 3, (p) => text[p - 1] !== " " && !(c === "_" && /\w/.test(text[p + 2] || ""))) : -1;
        if (near(text, i, end)) {
          flush();
          const node = el(c === "~" ? "del" : "strong");
          inline(text.slice(i + 2, end), node, depth + 1);
          parent.appendChild(node);
          i = end + 2;
          continue;
        }
        plain += mark;
        i += 2;
        continue;
      }
      if ((c === "*" || c === "_") && text[i + 1] !== undefined && text[i + 1] !== " " &&
          (c !== "_" || !/\w/.test(text[i - 1] || ""))) {
        // a closing mark: not after a space, not one of a pair; "_" only at a word's edge
        const end = find(c, i + 2, (p) => text[p - 1] !== " " && text[p + 1] !== c && text[p - 1] !== c &&
                                        !(c === "_" && /\w/.test(text[p + 1] || "")));
        if (near(text, i, end)) {
          flush();
          const node = el("em");
          inline(text.slice(i + 1, end), node, depth + 1);
          parent.appendChild(node);
          i = end + 1;
          continue;
        }
      }
      if (c === "[") {
        const m = at(LINK);
        if (m) {
          flush();
          parent.appendChild(link(m[2], m[1]));
          i += m[0].length;
          continue;
        }
      }
      if ((c === "h" || c === "H") && !/\w/.test(text[i - 1] || "")) {
        const m = at(BARE);
        if (m) {
          const url = m[0].replace(/[.,;:!?)\]]+$/, "");
          flush();
          parent.appendChild(link(url, null));
          i += url.length;
          continue;
        }
      }
      plain += c;
      i++;
    }
    flush();
    return parent;
  }

  // an <a> to url (http, https or mailto only, else the text as written); label null: the address
  // itself, as text
  function link(url, label) {
    if (!SAFE_URL.test(url)) return document.createTextNode(label === null ? url : "[" + label + "](" + url + ")");
    const a = el("a");
    a.href = url;
    a.rel = "noopener noreferrer";
    a.target = "_blank";
    if (label === null) a.textContent = url; else inline(label, a);
    return a;
  }

  // --- drawing -----------------------------------------------------------------------------------

  // the node of one block; hooks.code(block) makes a code block's node (the page adds its label,
  // highlighting and copy button)
  function draw(b, hooks, depth) {
    depth = depth || 0;
    switch (b.type) {
      case "code": return hooks.code(b);
      case "heading": return inline(b.text, el("h" + Math.min(b.level + 1, 6)));
      case "rule": return el("hr");
      case "quote":
        return depth < MAX_DEPTH ? fill(el("blockquote"), b.text, hooks, depth + 1) : inline(b.text, el("blockquote"));
      case "list": {
        const l = el(b.ordered ? "ol" : "ul");
        if (b.ordered && b.start !== 1) l.start = b.start;
        for (const item of b.items) {
          const li = el("li");
          // a tight item (no blank line in it) has its paragraphs' text without <p>
          const tight = !/\n\s*\n/.test(item);
          if (depth >= MAX_DEPTH) inline(item, li);
          else for (const ib of blocks(item)) {
            if (tight && ib.type === "para") inline(ib.text, li);
            else li.appendChild(draw(ib, hooks, depth + 1));
          }
          l.appendChild(li);
        }
        return l;
      }
      case "table": {
        const wrap = el("div", "table-wrap");
        const t = el("table");
        b.rows.forEach((row, r) => {
          const tr = el("tr");
          row.forEach((cell, k) => {
            const td = inline(cell, el(r === 0 ? "th" : "td"));
            if (b.align[k]) td.style.textAlign = b.align[k];
            tr.appendChild(td);
          });
          (r === 0 ? (t.tHead || t.createTHead()) : (t.tBodies[0] || t.createTBody())).appendChild(tr);
        });
        wrap.appendChild(t);
        return wrap;
      }
      default: return inline(b.text, el("p"));
    }
  }

  function fill(parent, text, hooks, depth) {
    for (const b of blocks(text)) parent.appendChild(draw(b, hooks, depth));
    return parent;
  }

  // draw text into container, keeping the nodes of the blocks that did not change since the last
  // call on the same container (container._blocks remembers them)
  function update(container, text, hooks) {
    const next = blocks(text);
    const prev = container._blocks || [];
    let keep = 0;
    while (keep < prev.length && keep < next.length && prev[keep].src === next[keep].src &&
           prev[keep].type === next[keep].type) keep++;
    const kids = container.children;
    while (kids.length > keep) container.removeChild(kids[kids.length - 1]);
    for (let k = keep; k < next.length; k++) container.appendChild(draw(next[k], hooks));
    container._blocks = next;
  }

  return {blocks: blocks, update: update, fill: fill, inline: inline};
})();
