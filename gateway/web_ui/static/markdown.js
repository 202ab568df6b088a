// A small Markdown renderer that builds DOM nodes: model output only ever becomes text nodes (textContent),
// elements this file chooses, and links whose address is http(s) or mailto. No string of the output is ever
// parsed as HTML, so a "<script>" or "<img onerror=...>" in it shows as those characters.
//
// Covered: fenced code blocks (``` or ~~~, with the language named), headings, paragraphs, bullet and numbered
// lists (one level), block quotes, horizontal rules, pipe tables; inline code, **bold**, *italic*, ~~strike~~,
// [links](https://...). An unclosed fence (a stream still writing it) renders as a code block so far.

const FENCE = /^ {0,3}(```+|~~~+)\s*([^`\s]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const BULLET = /^ {0,3}[-*+]\s+(.*)$/;
const NUMBERED = /^ {0,3}(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const TABLE_RULE = /^\s*\|?\s*:?-{1,}:?\s*(\|\s*:?-{1,}:?\s*)*\|?\s*$/;

function el(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

function safeHref(url) {
  try {
    const parsed = new URL(url, "http://invalid.invalid/");
    if (["http:", "https:", "mailto:"].includes(parsed.protocol) && /^(https?:|mailto:)/i.test(url)) return parsed.href;
  } catch (_) { /* not a URL: shown as text */ }
  return null;
}

// Inline spans, earliest match first; the text between matches is text nodes. Underscores inside a word
// (snake_case, __dunder__ names) stay text.
const INLINE_SOURCE = /(`+)([\s\S]*?[^`])\1(?!`)|\[([^\]\n]+)\]\(([^)\s]+)\)|\*\*([^*\s][^*\n]*?)\*\*|(?<![A-Za-z0-9_])__([^_\s][^_\n]*?)__(?![A-Za-z0-9_])|~~([^~\s][^~\n]*?)~~|\*([^*\s][^*\n]*?)\*|(?<![A-Za-z0-9_])_([^_\s][^_\n]*?)_(?![A-Za-z0-9_])/.source;

export function renderInline(text, parent) {
  // A regex of its own per call: the spans nest (a link inside bold), and a shared one's lastIndex would not.
  const inline = new RegExp(INLINE_SOURCE, "g");
  let last = 0;
  for (let m = inline.exec(text); m !== null; m = inline.exec(text)) {
    if (m.index > last) parent.append(document.createTextNode(text.slice(last, m.index)));
    if (m[1] !== undefined) {
      const code = el("code");
      code.textContent = m[2].replace(/^ (.*) $/, "$1");
      parent.append(code);
    } else if (m[3] !== undefined) {
      const href = safeHref(m[4]);
      if (href) {
        const a = el("a");
        a.href = href;
        a.rel = "noopener noreferrer nofollow";
        a.target = "_blank";
        renderInline(m[3], a);
        parent.append(a);
      } else {
        parent.append(document.createTextNode(m[0]));
      }
    } else {
      const [tag, inner] = m[5] !== undefined ? ["strong", m[5]] : m[6] !== undefined ? ["strong", m[6]]
        : m[7] !== undefined ? ["del", m[7]] : ["em", m[8] !== undefined ? m[8] : m[9]];
      const node = el(tag);
      renderInline(inner, node);
      parent.append(node);
    }
    last = inline.lastIndex;
  }
  if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
}

function codeBlock(lang, code) {
  const wrap = el("div", "code-block");
  const bar = el("div", "code-bar");
  const name = el("span");
  name.textContent = lang || "text";
  const copy = el("button", "copy");
  copy.type = "button";
  copy.textContent = "Copy";
  copy.addEventListener("click", () => {
    navigator.clipboard?.writeText(code).then(() => { copy.textContent = "Copied"; }, () => {});
  });
  bar.append(name, copy);
  const pre = el("pre");
  const c = el("code");
  c.textContent = code;
  pre.append(c);
  wrap.append(bar, pre);
  return wrap;
}

function splitRow(line) {
  let cells = line.trim();
  if (cells.startsWith("|")) cells = cells.slice(1);
  if (cells.endsWith("|") && !cells.endsWith("\\|")) cells = cells.slice(0, -1);
  return cells.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
}

function table(header, rows) {
  const t = el("table");
  const head = el("thead");
  const tr = el("tr");
  for (const cell of header) {
    const th = el("th");
    renderInline(cell, th);
    tr.append(th);
  }
  head.append(tr);
  const body = el("tbody");
  for (const row of rows) {
    const r = el("tr");
    for (let i = 0; i < header.length; i++) {
      const td = el("td");
      renderInline(row[i] || "", td);
      r.append(td);
    }
    body.append(r);
  }
  t.append(head, body);
  const wrap = el("div", "table-wrap");
  wrap.append(t);
  return wrap;
}

function startsBlock(line, next) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || BULLET.test(line) || NUMBERED.test(line)
    || QUOTE.test(line) || (line.includes("|") && next !== undefined && TABLE_RULE.test(next) && next.includes("-"));
}

// Markdown text -> a DocumentFragment.
export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) { i++; continue; }
    if ((m = FENCE.exec(line))) {
      const close = new RegExp("^ {0,3}" + m[1][0] + "{" + m[1].length + ",}\\s*$");
      const body = [];
      for (i++; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
      i++;
      out.append(codeBlock(m[2], body.join("\n")));
    } else if ((m = HEADING.exec(line))) {
      const h = el("h" + Math.min(m[1].length + 2, 6));
      renderInline(m[2], h);
      out.append(h);
      i++;
    } else if (RULE.test(line)) {
      out.append(el("hr"));
      i++;
    } else if (BULLET.test(line) || NUMBERED.test(line)) {
      const ordered = !BULLET.test(line);
      const pattern = ordered ? NUMBERED : BULLET;
      const list = el(ordered ? "ol" : "ul");
      if (ordered) list.start = parseInt(NUMBERED.exec(line)[1], 10);
      let item = null;
      while (i < lines.length) {
        const l = lines[i];
        if ((m = pattern.exec(l))) {
          item = el("li");
          renderInline(ordered ? m[2] : m[1], item);
          list.append(item);
        } else if (l.trim() && /^\s{2,}/.test(l) && item) {
          item.append(document.createTextNode(" "));
          renderInline(l.trim(), item);
        } else {
          break;
        }
        i++;
      }
      out.append(list);
    } else if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) { body.push(m[1]); i++; }
      const q = el("blockquote");
      q.append(renderMarkdown(body.join("\n")));
      out.append(q);
    } else if (line.includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1]) && lines[i + 1].includes("-")) {
      const header = splitRow(line);
      const rows = [];
      for (i += 2; i < lines.length && lines[i].includes("|") && lines[i].trim(); i++) rows.push(splitRow(lines[i]));
      out.append(table(header, rows));
    } else {
      const p = el("p");
      const body = [line];
      for (i++; i < lines.length && lines[i].trim() && !startsBlock(lines[i], lines[i + 1]); i++) body.push(lines[i]);
      body.forEach((l, k) => {
        if (k) p.append(el("br"));
        renderInline(l, p);
      });
      out.append(p);
    }
  }
  return out;
}
