// The API key dialog: shown when the server answers 401, it keeps the key (api.js) once the server takes it.

import { apiKey, setApiKey, Unauthorized } from "./api.js";

const $ = (id) => document.getElementById(id);

export class KeyDialog {
  // check(): a call that needs the key (throws Unauthorized when it is refused); poller: paused while asking.
  constructor(check, poller) {
    this.check = check;
    this.poller = poller;
    this.waiters = [];
    $("key-form").addEventListener("submit", (event) => this.submit(event));
    $("key-button").addEventListener("click", () => this.ask(""));
  }

  // Resolves once a key the server takes is given.
  ask(reason) {
    const dialog = $("key-dialog");
    this.poller.pause();
    $("key-reason").textContent = apiKey() ? "The server refused this key." : "This server needs an API key.";
    this.showError(reason);
    $("key-button").hidden = false;
    if (!dialog.open) dialog.showModal();
    $("key-input").focus();
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  showError(message) {
    const error = $("key-error");
    error.hidden = !message;
    error.textContent = message || "";
  }

  async submit(event) {
    event.preventDefault();
    setApiKey($("key-input").value.trim());
    try {
      await this.check();
    } catch (e) {
      this.showError(e.message);
      $("key-reason").textContent = e instanceof Unauthorized ? "The server refused this key." : "The server did not answer.";
      return;
    }
    $("key-dialog").close();
    $("key-input").value = "";
    this.poller.resume();
    const waiters = this.waiters;
    this.waiters = [];
    waiters.forEach((resolve) => resolve());
  }
}
