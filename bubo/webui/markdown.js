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

  // the closing `mark` for an opening at i, within REACH and the same line; -1 when there is none
  function closing(text, mark, from) {
    const stop = Math.min(text.length, from + REACH);
    const eol = text.indexOf("\n", from);
    const end = text.indexOf(mark, from);
    return end >= 0 && end < stop && (eol < 0 || end < eol) ? end : -1;
  }

  // text with **strong**, *em*, ~~del~~, `code`, [links](url), bare URLs and line breaks, as nodes
  function inline(text, parent) {
    let i = 0, plain = "";
    const flush = () => { if (plain) { parent.appendChild(document.createTextNode(plain)); plain = ""; } };
    const at = (re) => { re.lastIndex = i; return re.exec(text); };
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
        const end = text.indexOf(run, i + run.length);
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
        let end = text[i + 2] !== " " && (c !== "_" || !/\w/.test(text[i - 1] || "")) ? closing(text, mark, i + 2) : -1;
        while (end > 0 && end - i <= REACH && (text[end - 1] === " " || (c === "_" && /\w/.test(text[end + 2] || ""))))
          end = closing(text, mark, end + 1);
        if (end > i + 2 && end - i <= REACH) {
          flush();
          const node = el(c === "~" ? "del" : "strong");
          inline(text.slice(i + 2, end), node);
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
        let end = closing(text, c, i + 1);
        // not the start of a double mark, not after a space; "_" only at a word's edge
        while (end > 0 && end - i <= REACH &&
               (text[end - 1] === " " || text[end + 1] === c || (c === "_" && /\w/.test(text[end + 1] || ""))))
          end = closing(text, c, end + (text[end + 1] === c ? 2 : 1));
        if (end > i + 1 && end - i <= REACH) {
          flush();
          const node = el("em");
          inline(text.slice(i + 1, end), node);
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
          parent.appendChild(link(url, url));
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

  function link(url, label) {
    if (!SAFE_URL.test(url)) return document.createTextNode("[" + label + "](" + url + ")");
    const a = el("a");
    a.href = url;
    a.rel = "noopener noreferrer";
    a.target = "_blank";
    inline(label, a);
    return a;
  }

  // --- drawing -----------------------------------------------------------------------------------

  // the node of one block; hooks.code(block) makes a code block's node (the page adds its label,
  // highlighting and copy button)
  function draw(b, hooks) {
    switch (b.type) {
      case "code": return hooks.code(b);
      case "heading": return inline(b.text, el("h" + Math.min(b.level + 1, 6)));
      case "rule": return el("hr");
      case "quote": return fill(el("blockquote"), b.text, hooks);
      case "list": {
        const l = el(b.ordered ? "ol" : "ul");
        if (b.ordered && b.start !== 1) l.start = b.start;
        for (const item of b.items) {
          const li = el("li");
          const inner = blocks(item);
          if (inner.length === 1 && inner[0].type === "para") inline(inner[0].text, li);
          else for (const ib of inner) li.appendChild(draw(ib, hooks));
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

  function fill(parent, text, hooks) {
    for (const b of blocks(text)) parent.appendChild(draw(b, hooks));
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
