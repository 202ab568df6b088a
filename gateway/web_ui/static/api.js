// The server's API as the page uses it: the key, JSON calls, and a chat completion's SSE stream.

const KEY_STORE = "mili.apiKey";

export class Unauthorized extends Error {}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function apiKey() {
  return localStorage.getItem(KEY_STORE) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_STORE, key);
  else localStorage.removeItem(KEY_STORE);
}

function headers(extra) {
  const h = { ...extra };
  const key = apiKey();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

// The message of an OpenAI error object, or the status line.
async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
    else if (body && body.reason) message = body.reason; // /health while starting or draining
  } catch (_) { /* not JSON */ }
  if (response.status === 401) return new Unauthorized(message);
  return new ApiError(response.status, message);
}

export async function call(path, { method = "GET", body, signal, accept } = {}) {
  const init = { method, signal, headers: headers(accept ? { Accept: accept } : {}), cache: "no-store" };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  return response;
}

export async function getJson(path) {
  return (await call(path)).json();
}

// POST /v1/chat/completions with stream: true; calls onChunk(chunk) for each data event until [DONE]. An error
// object inside the stream (e.g. a deadline) is thrown as an ApiError.
export async function streamChat(body, signal, onChunk) {
  const response = await call("/v1/chat/completions", { method: "POST", body, signal, accept: "text/event-stream" });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    // SSE lines end in \r\n, \n or \r; the last piece may be a partial line.
    const lines = buffer.split(/\r\n|\n|\r/);
    buffer = lines.pop();
    for (const line of lines) {
      if (line === "") {
        if (data.length) {
          const text = data.join("\n");
          data = [];
          if (text === "[DONE]") return;
          const chunk = JSON.parse(text);
          if (chunk.error) throw new ApiError(chunk.error.code || 500, chunk.error.message);
          onChunk(chunk);
        }
      } else if (line.startsWith("data:")) {
        data.push(line.slice(5).replace(/^ /, ""));
      } // comments (": ping"), event names and ids are not needed
    }
  }
}
