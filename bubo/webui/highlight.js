"use strict";
// Syntax colours for the code blocks of the chat page: one scanner, a table of languages (their
// keywords, comments and strings). It makes spans with textContent, never HTML, and it is linear
// in the code's length (no backtracking pattern): a block is coloured again as it grows.
const BuboHighlight = (function () {
  const words = (s) => new Set(s.split(" "));
  const C_LIKE = {line: ["//"], block: [["/*", "*/"]], quotes: "\"'"};
  const LANGS = {
    python: {line: ["#"], block: [], quotes: "\"'", triple: true, kw: words(
      "False None True and as assert async await break class continue def del elif else except finally for from " +
      "global if import in is lambda nonlocal not or pass raise return try while with yield match case self print " +
      "len range int str float list dict set tuple bool")},
    javascript: Object.assign({}, C_LIKE, {quotes: "\"'`", kw: words(
      "async await break case catch class const continue debugger default delete do else export extends false " +
      "finally for function if import in instanceof let new null of return static super switch this throw true " +
      "try typeof undefined var void while with yield interface type enum implements readonly public private " +
      "protected number string boolean any console")}),
    c: Object.assign({}, C_LIKE, {pre: true, kw: words(
      "auto bool break case char class const constexpr continue default delete do double else enum explicit " +
      "extern false float for friend goto if inline int long namespace new nullptr operator private protected " +
      "public return short signed sizeof static struct switch template this throw true try typedef typename " +
      "union unsigned using virtual void volatile while size_t uint8_t int32_t int64_t uint32_t uint64_t std " +
      "include define ifdef ifndef endif")}),
    java: Object.assign({}, C_LIKE, {kw: words(
      "abstract boolean break byte case catch char class const continue default do double else enum extends " +
      "final finally float for if implements import instanceof int interface long new null package private " +
      "protected public return short static super switch synchronized this throw throws true false try void " +
      "volatile while var String override fun val when object data is in out")}),
    go: Object.assign({}, C_LIKE, {quotes: "\"'`", kw: words(
      "break case chan const continue default defer else fallthrough for func go goto if import interface map " +
      "package range return select struct switch type var true false nil int string bool error byte rune " +
      "float64 int64 make len append")}),
    rust: Object.assign({}, C_LIKE, {quotes: "\"", kw: words(
      "as async await break const continue crate dyn else enum extern false fn for if impl in let loop match mod " +
      "move mut pub ref return self Self static struct super trait true type unsafe use where while i32 i64 u8 " +
      "u32 u64 usize f32 f64 bool str String Vec Option Some None Result Ok Err")}),
    shell: {line: ["#"], block: [], quotes: "\"'", kw: words(
      "if then else elif fi for while do done case esac in function return export local echo cd ls cat grep " +
      "sudo apt pip python curl git set unset source exit")},
    sql: {line: ["--"], block: [["/*", "*/"]], quotes: "'\"", caseless: true, kw: words(
      "select from where and or not insert into values update set delete create table drop alter join left " +
      "right inner outer on group by order having limit as distinct count sum avg min max null is in like " +
      "primary key foreign references index union all case when then else end")},
    json: {line: [], block: [], quotes: "\"", kw: words("true false null")},
    css: {line: [], block: [["/*", "*/"]], quotes: "\"'", kw: words("important")},
    yaml: {line: ["#"], block: [], quotes: "\"'", kw: words("true false null yes no")},
    ruby: {line: ["#"], block: [], quotes: "\"'", kw: words(
      "def end if elsif else unless while until for in do return class module self nil true false puts require " +
      "yield begin rescue ensure")},
    html: {markup: true},
  };
  const ALIASES = {py: "python", python3: "python", js: "javascript", jsx: "javascript", ts: "javascript",
                   tsx: "javascript", typescript: "javascript", mjs: "javascript", node: "javascript",
                   "c++": "c", cpp: "c", cc: "c", h: "c", hpp: "c", cxx: "c", cs: "java", csharp: "java",
                   kotlin: "java", kt: "java", scala: "java", swift: "java", golang: "go", rs: "rust",
                   sh: "shell", bash: "shell", zsh: "shell", console: "shell", shell: "shell", ps1: "shell",
                   powershell: "shell", jsonc: "json", scss: "css", less: "css", yml: "yaml", toml: "yaml",
                   ini: "yaml", rb: "ruby", xml: "html", svg: "html", vue: "html"};

  function language(name) {
    const n = (name || "").toLowerCase();
    return LANGS[n] ? n : ALIASES[n] || null;
  }

  function span(parent, cls, text) {
    if (!text) return;
    if (!cls) { parent.appendChild(document.createTextNode(text)); return; }
    const s = document.createElement("span");
    s.className = "tok-" + cls;
    s.textContent = text;
    parent.appendChild(s);
  }

  function markup(code, out) {
    let i = 0;
    while (i < code.length) {
      if (code.startsWith("<!--", i)) {
        const e = code.indexOf("-->", i + 4);
        const end = e < 0 ? code.length : e + 3;
        span(out, "comment", code.slice(i, end));
        i = end;
      } else if (code[i] === "<") {
        const e = code.indexOf(">", i);
        const end = e < 0 ? code.length : e + 1;
        const tag = code.slice(i, end);
        const m = /^(<\/?[\w:-]*)([\s\S]*)$/.exec(tag);
        span(out, "keyword", m[1]);
        const rest = m[2];
        let k = 0;
        while (k < rest.length) {
          const q = rest[k];
          if (q === "\"" || q === "'") {
            const close = rest.indexOf(q, k + 1);
            const stop = close < 0 ? rest.length : close + 1;
            span(out, "string", rest.slice(k, stop));
            k = stop;
          } else {
            let stop = k;
            while (stop < rest.length && rest[stop] !== "\"" && rest[stop] !== "'") stop++;
            span(out, "attr", rest.slice(k, stop));
            k = stop;
          }
        }
        i = end;
      } else {
        let e = code.indexOf("<", i);
        if (e < 0) e = code.length;
        span(out, null, code.slice(i, e));
        i = e;
      }
    }
  }

  // the code's nodes, coloured for lang (plain text for a language not in the table)
  function highlight(code, lang) {
    const out = document.createDocumentFragment();
    const name = language(lang);
    const L = name && LANGS[name];
    if (!L) { out.appendChild(document.createTextNode(code)); return out; }
    if (L.markup) { markup(code, out); return out; }
    let i = 0, plain = "";
    const flush = () => { span(out, null, plain); plain = ""; };
    while (i < code.length) {
      const c = code[i];
      const line = L.line.find((p) => code.startsWith(p, i));
      if (line && !(name === "shell" && i > 0 && !/\s/.test(code[i - 1]))) {
        let e = code.indexOf("\n", i);
        if (e < 0) e = code.length;
        flush(); span(out, "comment", code.slice(i, e)); i = e;
        continue;
      }
      const block = L.block.find((b) => code.startsWith(b[0], i));
      if (block) {
        const e = code.indexOf(block[1], i + block[0].length);
        const end = e < 0 ? code.length : e + block[1].length;
        flush(); span(out, "comment", code.slice(i, end)); i = end;
        continue;
      }
      if (L.quotes.includes(c)) {
        const triple = L.triple && code.startsWith(c + c + c, i) ? c + c + c : null;
        let j = i + (triple ? 3 : 1);
        for (; j < code.length; j++) {
          if (code[j] === "\\") { j++; continue; }
          if (triple ? code.startsWith(triple, j) : code[j] === c) break;
          if (!triple && c !== "`" && code[j] === "\n") break;
        }
        const end = Math.min(code.length, j + (triple ? 3 : 1));
        flush(); span(out, "string", code.slice(i, end)); i = end;
        continue;
      }
      if (/[0-9]/.test(c) && !/[\w$]/.test(code[i - 1] || "")) {
        const m = /^(0x[0-9a-fA-F_]+|\d[\d_]*(\.\d+)?([eE][+-]?\d+)?)/.exec(code.slice(i, i + 64));
        flush(); span(out, "number", m[0]); i += m[0].length;
        continue;
      }
      if (/[A-Za-z_$@]/.test(c) && !/[\w$]/.test(code[i - 1] || "")) {
        let j = i + 1;
        while (j < code.length && /[\w$]/.test(code[j])) j++;
        const word = code.slice(i, j);
        const key = L.caseless ? word.toLowerCase() : word;
        if (L.kw.has(key) || (L.pre && c === "#")) { flush(); span(out, "keyword", word); }
        else if (code[j] === "(") { flush(); span(out, "function", word); }
        else plain += word;
        i = j;
        continue;
      }
      if (L.pre && c === "#" && (i === 0 || code[i - 1] === "\n")) {
        let j = i + 1;
        while (j < code.length && /\w/.test(code[j])) j++;
        flush(); span(out, "keyword", code.slice(i, j)); i = j;
        continue;
      }
      plain += c;
      i++;
    }
    flush();
    return out;
  }

  return {highlight: highlight, language: language};
})();
