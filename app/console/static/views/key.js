// The API key form: the key goes to sessionStorage (this tab only) and is never shown again.
import { key } from "../api.js";
import { h } from "../dom.js";

function form(reason) {
  const input = h("input", { type: "password", name: "key", autocomplete: "off", spellcheck: "false", required: true, id: "key-input" });
  const submit = (event) => {
    event.preventDefault();
    const value = input.value.trim();
    input.value = "";
    if (!value) return;
    key.set(value);
    if (window.location.hash === "#/key") window.location.hash = "#/threads";
    else window.dispatchEvent(new HashChangeEvent("hashchange"));
  };
  return h("section", {},
    h("h1", {}, "API key"),
    reason ? h("p", {}, reason) : null,
    h("p", { class: "muted" }, "Paste a key made with `agentstate keys create`. It is kept in this tab's session storage only, sent as the Authorization header, and never shown or put in a URL."),
    h("form", { class: "key-form", on: { submit } },
      h("label", { for: "key-input" }, "Key"), input,
      h("button", { type: "submit" }, "Use this key")));
}

export default {
  routes: ["key"],
  form,
  render: () => form(null),
};
