// Conversations and settings in the browser's local storage; the server keeps none of it.

const CONVERSATIONS = "mili.conversations";
const SETTINGS = "mili.settings";

function read(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value === null ? fallback : value;
  } catch (_) {
    return fallback;
  }
}

function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (e) {
    console.warn("local storage is full or off; this is not kept:", e);
  }
}

// [{id, title, updated, messages: [{role, content, reasoning, toolCalls, stats, error}]}], newest first.
export function loadConversations() {
  const list = read(CONVERSATIONS, []);
  return Array.isArray(list) ? list.filter((c) => c && Array.isArray(c.messages)) : [];
}

export function saveConversations(list) {
  write(CONVERSATIONS, list);
}

export function newConversation() {
  const id = (crypto.randomUUID ? crypto.randomUUID() : String(Date.now()) + Math.random());
  return { id, title: "New chat", updated: Date.now(), messages: [] };
}

export function loadSettings() {
  return read(SETTINGS, {});
}

export function saveSettings(settings) {
  write(SETTINGS, settings);
}
