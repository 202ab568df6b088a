// MILI's chat page: wires the composer, the settings, the conversation list, the key dialog and the server
// panel to the public API. Conversations live in local storage (store.js); nothing is kept on the server.

import { getJson, streamChat, Unauthorized } from "./api.js";
import { messageView, editorView } from "./chat_view.js";
import { KeyDialog } from "./key_dialog.js";
import { ServerPanel } from "./panel.js";
import { restoreSettings, requestBody } from "./settings.js";
import { loadConversations, saveConversations, newConversation } from "./store.js";

const $ = (id) => document.getElementById(id);

let conversations = loadConversations();
let current = conversations[0] || newConversation();
let modelName = null;
let running = null; // {controller, message} while an answer streams
let editing = null; // index of the user message being edited
let frame = 0;

// ---- the API key --------------------------------------------------------------------------------------------

const keyDialog = new KeyDialog(loadModel, { pause: () => panel.pause(), resume: () => panel.resume() });
const askForKey = (reason) => keyDialog.ask(reason);

// ---- the model ----------------------------------------------------------------------------------------------

async function loadModel() { // also the key dialog's check of a key
  const models = await getJson("/v1/models");
  const card = models.data && models.data[0];
  modelName = card ? card.id : null;
  $("model-name").textContent = modelName
    ? modelName + (card.max_model_len ? ` · ${card.max_model_len} tokens of context` : "") : "no model";
}

// ---- the conversation list ----------------------------------------------------------------------------------

function persist() {
  if (current.messages.length) {
    current.updated = Date.now();
    conversations = [current, ...conversations.filter((c) => c.id !== current.id)];
  }
  saveConversations(conversations);
  renderList();
}

function renderList() {
  const list = $("conversation-list");
  list.replaceChildren();
  for (const conv of conversations) {
    const item = document.createElement("li");
    if (conv.id === current.id) item.className = "active";
    const open = document.createElement("button");
    open.type = "button";
    open.className = "ghost open";
    open.textContent = conv.title;
    open.title = conv.title;
    open.addEventListener("click", () => { if (!running) { current = conv; editing = null; render(); renderList(); } });
    const del = document.createElement("button");
    del.type = "button";
    del.className = "ghost delete";
    del.textContent = "×";
    del.title = "Delete this conversation";
    del.addEventListener("click", () => {
      if (running && conv.id === current.id) return;
      conversations = conversations.filter((c) => c.id !== conv.id);
      if (conv.id === current.id) current = conversations[0] || newConversation();
      saveConversations(conversations);
      render();
      renderList();
    });
    item.append(open, del);
    list.append(item);
  }
}

$("new-chat").addEventListener("click", () => {
  if (running) return;
  current = newConversation();
  editing = null;
  render();
  renderList();
  $("prompt").focus();
});

// ---- the messages -------------------------------------------------------------------------------------------

function nearBottom(box) {
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

function render() {
  const box = $("messages");
  const stick = nearBottom(box);
  const nodes = current.messages.map((m, i) => {
    if (i === editing) {
      return editorView(m, (text) => resendEdited(i, text), () => { editing = null; render(); });
    }
    return messageView(m, i, { isLast: i === current.messages.length - 1, busy: Boolean(running),
      handlers: { edit: (k) => { editing = k; render(); }, regenerate } });
  });
  if (!nodes.length) {
    const empty = document.createElement("div");
    empty.className = "empty";
    empty.textContent = "Ask the model something.";
    nodes.push(empty);
  }
  box.replaceChildren(...nodes);
  if (stick) box.scrollTop = box.scrollHeight;
  $("send").hidden = Boolean(running);
  $("stop").hidden = !running;
}

// Streaming redraws at most once a frame.
function scheduleRender() {
  if (!frame) frame = requestAnimationFrame(() => { frame = 0; render(); });
}

function showSettingsError(message) {
  const error = $("settings-error");
  error.hidden = !message;
  error.textContent = message || "";
}

async function answer() {
  let body;
  try {
    body = requestBody(current.messages, modelName);
    showSettingsError("");
  } catch (e) {
    showSettingsError(e.message);
    return;
  }
  const message = { role: "assistant", content: "", reasoning: "", toolCalls: [], model: modelName, streaming: true,
    stats: {} };
  current.messages.push(message);
  const controller = new AbortController();
  running = { controller, message };
  render();
  const started = performance.now();
  let first = null;
  try {
    await streamChat(body, controller.signal, (chunk) => {
      const now = performance.now();
      if (chunk.usage) {
        message.stats.promptTokens = chunk.usage.prompt_tokens;
        message.stats.completionTokens = chunk.usage.completion_tokens;
        message.stats.cachedTokens = chunk.usage.prompt_tokens_details?.cached_tokens || 0;
      }
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) return;
      const delta = choice.delta || {};
      if (delta.content || delta.reasoning_content || delta.tool_calls) {
        if (first === null) {
          first = now;
          message.stats.ttftMs = now - started;
        }
        message.stats.lastMs = now;
      }
      if (delta.content) message.content += delta.content;
      if (delta.reasoning_content) message.reasoning += delta.reasoning_content;
      for (const part of delta.tool_calls || []) {
        const call = (message.toolCalls[part.index] ||= { id: "", type: "function", function: { name: "", arguments: "" } });
        if (part.id) call.id = part.id;
        if (part.function?.name) call.function.name += part.function.name;
        if (part.function?.arguments) call.function.arguments += part.function.arguments;
      }
      if (choice.finish_reason) message.stats.finish = choice.finish_reason;
      scheduleRender();
    });
    // Decode speed: the tokens after the first, over the time after the first token.
    const out = message.stats.completionTokens;
    if (out > 1 && first !== null && message.stats.lastMs > first) {
      message.stats.tokensPerS = (out - 1) / ((message.stats.lastMs - first) / 1000);
    }
  } catch (e) {
    if (e.name === "AbortError") {
      message.stats.finish = "stopped";
    } else if (e instanceof Unauthorized) {
      current.messages.pop(); // nothing was answered: the question waits for the key
      running = null;
      render();
      await askForKey(e.message);
      return answer();
    } else {
      message.error = e.message;
    }
  } finally {
    message.streaming = false;
    delete message.stats.lastMs;
    if (running && running.message === message) running = null;
    render();
    persist();
  }
}

async function send(text) {
  if (running || !text.trim()) return;
  if (!current.messages.length) current.title = text.trim().split("\n")[0].slice(0, 60);
  current.messages.push({ role: "user", content: text });
  persist();
  await answer();
}

function regenerate(index) {
  if (running) return;
  current.messages = current.messages.slice(0, index);
  answer();
}

function resendEdited(index, text) {
  if (running || !text.trim()) return;
  editing = null;
  current.messages = current.messages.slice(0, index);
  send(text);
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || running) return;
  $("prompt").value = "";
  send(text);
});

$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});

// Stop: aborting the fetch closes the connection, and the server aborts the request (it frees its KV blocks).
$("stop").addEventListener("click", () => { if (running) running.controller.abort(); });

// ---- start --------------------------------------------------------------------------------------------------

const panel = new ServerPanel((reason) => { if (!$("key-dialog").open) askForKey(reason); });

async function start() {
  restoreSettings();
  render();
  renderList();
  panel.start();
  try {
    await loadModel();
  } catch (e) {
    if (e instanceof Unauthorized) await askForKey(e.message);
    else $("model-name").textContent = "unavailable: " + e.message;
  }
  document.body.dataset.ready = "true";
}

document.addEventListener("visibilitychange", () => { if (!document.hidden) panel.tick(); });
start();
