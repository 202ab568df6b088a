// The settings beside the chat: kept in local storage, and turned into the request body they ask for.

import { loadSettings, saveSettings } from "./store.js";

const $ = (id) => document.getElementById(id);
export const thinkingModel = document.body.dataset.thinking === "true";

const SETTING_FIELDS = { "system-prompt": "value", temperature: "value", "top-p": "value", "max-tokens": "value",
  thinking: "checked", "json-schema": "value", tools: "value", "tool-choice": "value" };

export function restoreSettings() {
  const saved = loadSettings();
  for (const [id, prop] of Object.entries(SETTING_FIELDS)) {
    if (saved[id] !== undefined) $(id)[prop] = saved[id];
    $(id).addEventListener("change", () => {
      const now = loadSettings();
      now[id] = $(id)[prop];
      saveSettings(now);
    });
  }
  $("thinking-row").hidden = !thinkingModel;
}

function parseJsonSetting(id, what) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${what} is not valid JSON: ${e.message}`);
  }
}

function number(id) {
  const text = $(id).value.trim();
  return text === "" ? undefined : Number(text);
}

// The request the settings make for these messages, to the model named.
export function requestBody(messages, modelName) {
  const history = [];
  const system = $("system-prompt").value.trim();
  if (system) history.push({ role: "system", content: system });
  for (const m of messages) {
    // The page runs no tools, so an earlier answer's tool calls have no results to send back with them: the
    // history carries each answer's text only.
    history.push({ role: m.role, content: m.content || "" });
  }
  const body = { model: modelName || undefined, messages: history, stream: true,
    stream_options: { include_usage: true }, temperature: number("temperature"), top_p: number("top-p"),
    max_tokens: number("max-tokens") };
  if (thinkingModel) body.chat_template_kwargs = { enable_thinking: $("thinking").checked };
  const schema = parseJsonSetting("json-schema", "The JSON schema");
  if (schema !== undefined) {
    body.response_format = { type: "json_schema", json_schema: { name: "answer", schema, strict: true } };
  }
  const tools = parseJsonSetting("tools", "Tools");
  if (tools !== undefined) {
    if (!Array.isArray(tools)) throw new Error("Tools must be a JSON array of {type: 'function', function: {...}}");
    if (tools.length) {
      body.tools = tools;
      body.tool_choice = $("tool-choice").value;
    }
  }
  return body;
}
