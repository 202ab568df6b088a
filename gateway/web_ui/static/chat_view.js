// One conversation's messages as DOM: Markdown answers, folded reasoning, tool calls, per-answer numbers, and
// the buttons (edit, regenerate, copy). Every piece of model or user text goes in as text (markdown.js).

import { renderMarkdown } from "./markdown.js";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(label, className, onClick) {
  const b = el("button", className, label);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

// A model that reasons in <think> tags that the server did not split off (reasoning_content) still gets its
// reasoning shown apart: the leading <think> block of the content.
export function splitThink(content) {
  const m = /^\s*<think>([\s\S]*?)(<\/think>\s*|$)([\s\S]*)$/.exec(content);
  return m ? { reasoning: m[1].trim(), content: m[3] } : { reasoning: "", content };
}

function statsText(stats) {
  if (!stats) return "";
  const parts = [];
  if (stats.ttftMs !== undefined) parts.push(`TTFT ${Math.round(stats.ttftMs)} ms`);
  if (stats.tokensPerS !== undefined) parts.push(`${stats.tokensPerS.toFixed(1)} tokens/s`);
  if (stats.promptTokens !== undefined) parts.push(`${stats.promptTokens} tokens in`);
  if (stats.completionTokens !== undefined) parts.push(`${stats.completionTokens} out`);
  if (stats.cachedTokens) parts.push(`${stats.cachedTokens} cached`);
  if (stats.finish) parts.push(stats.finish);
  return parts.join(" · ");
}

function toolCallsView(calls) {
  const box = el("div", "tool-calls");
  for (const call of calls) {
    const item = el("div", "tool-call");
    item.append(el("div", "tool-name", "Tool call: " + (call.function?.name || "?")));
    let args = call.function?.arguments || "";
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (_) { /* still streaming, or not JSON */ }
    const pre = el("pre");
    pre.append(el("code", "", args));
    item.append(pre);
    box.append(item);
  }
  return box;
}

// handlers: {edit(index), regenerate(index)}; busy: an answer is streaming (no edits then).
export function messageView(message, index, { isLast, busy, handlers }) {
  const node = el("div", `message ${message.role}`);
  node.dataset.index = String(index);
  const role = el("div", "role", message.role === "user" ? "You" : message.model || "Assistant");
  node.append(role);
  if (message.role === "user") {
    node.append(el("div", "content plain", message.content));
    if (!busy) {
      const tools = el("div", "actions");
      tools.append(button("Edit", "ghost edit", () => handlers.edit(index)));
      node.append(tools);
    }
    return node;
  }
  const split = message.reasoning ? { reasoning: message.reasoning, content: message.content }
    : splitThink(message.content || "");
  if (split.reasoning) {
    const details = el("details", "reasoning");
    // Open while only reasoning has come, folded once the answer starts; as the reader left it once they
    // opened or closed it (the view is redrawn as the answer streams).
    const thinkingNow = Boolean(message.streaming && !split.content.trim());
    details.open = message.reasoningOpen ?? thinkingNow;
    details.addEventListener("toggle", () => { if (details.open !== thinkingNow) message.reasoningOpen = details.open; });
    details.append(el("summary", "", message.streaming && !split.content.trim() ? "Thinking…" : "Reasoning"));
    details.append(el("div", "reasoning-text", split.reasoning));
    node.append(details);
  }
  const content = el("div", "content markdown");
  content.append(renderMarkdown(split.content || ""));
  if (message.streaming) {
    // The cursor at the end of the text so far: inside the last paragraph or list item, else after it.
    let tail = content.lastElementChild;
    while (tail && ["UL", "OL", "BLOCKQUOTE"].includes(tail.tagName) && tail.lastElementChild) tail = tail.lastElementChild;
    (tail && ["P", "LI"].includes(tail.tagName) ? tail : content).append(el("span", "cursor", "▍"));
  }
  node.append(content);
  if (message.toolCalls && message.toolCalls.length) node.append(toolCallsView(message.toolCalls));
  if (message.error) node.append(el("div", "error", message.error));
  const meta = el("div", "actions");
  meta.append(el("span", "stats", statsText(message.stats)));
  if (!busy) {
    if (isLast) meta.append(button("Regenerate", "ghost regenerate", () => handlers.regenerate(index)));
    meta.append(button("Copy", "ghost", () => navigator.clipboard?.writeText(message.content || "")));
  }
  node.append(meta);
  return node;
}

// An editor in place of a user message: save sends the conversation again from there.
export function editorView(message, onSave, onCancel) {
  const node = el("div", "message user editing");
  const area = el("textarea", "edit-box");
  area.value = message.content;
  area.rows = Math.min(12, Math.max(3, message.content.split("\n").length + 1));
  const actions = el("div", "actions");
  actions.append(button("Send", "save", () => onSave(area.value)), button("Cancel", "ghost", onCancel));
  node.append(area, actions);
  setTimeout(() => area.focus(), 0);
  return node;
}
