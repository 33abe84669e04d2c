// The console's shell: navigation built from the views, the key, and the hash router.
// A view is one module in views/ listed in views/index.js (docs/console.md, "Adding a view").
import { ApiError, key } from "./api.js";
import { clear, h, notice } from "./dom.js";
import { VIEWS } from "./views/index.js";
import keyView from "./views/key.js";

// A policy violation means the page tried something it must never do: say so loudly.
document.addEventListener("securitypolicyviolation", (event) => {
  console.error(`Content-Security-Policy violation: ${event.violatedDirective} blocked ${event.blockedURI || "inline code"}`);
});

const main = document.getElementById("view");
let current = null;

/** "threads/:id/:tab?" against the hash's path segments: the named parts, or null. */
export function match(pattern, segments) {
  const parts = pattern.split("/");
  const params = {};
  if (segments.length > parts.length) return null;
  for (let i = 0; i < parts.length; i++) {
    const part = parts[i];
    const optional = part.endsWith("?");
    const name = part.replace(/^:/, "").replace(/\?$/, "");
    if (i >= segments.length) {
      if (!optional) return null;
      continue;
    }
    if (part.startsWith(":")) params[name] = segments[i];
    else if (part !== segments[i]) return null;
  }
  return params;
}

function location_() {
  const hash = window.location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = hash.split(/\?(.*)/s);
  let segments;
  try {
    segments = path ? path.split("/").map(decodeURIComponent) : [];
  } catch {
    segments = ["?"];
  }
  return { segments, query: new URLSearchParams(query) };
}

function nav() {
  const { segments } = location_();
  const el = clear(document.getElementById("nav"));
  for (const view of VIEWS.filter((v) => v.nav)) {
    const active = view.nav.section === (segments[0] || "threads");
    el.append(h("a", { href: view.nav.href, "aria-current": active ? "page" : undefined }, view.nav.label));
  }
  const status = clear(document.getElementById("key-status"));
  if (key.get()) {
    status.append(h("span", { class: "muted" }, "API key set "),
      h("button", { type: "button", on: { click: () => { key.clear(); render(); } } }, "Forget key"));
  } else {
    status.append(h("a", { href: "#/key" }, "Enter API key"));
  }
}

async function render() {
  if (current) current.abort();
  const controller = new AbortController();
  current = controller;
  nav();
  const { segments, query } = location_();
  if (segments.length === 0) { window.location.replace("#/threads"); return; }
  let view = null;
  let params = null;
  for (const candidate of [...VIEWS, keyView]) {
    for (const pattern of candidate.routes) {
      params = match(pattern, segments);
      if (params) { view = candidate; break; }
    }
    if (view) break;
  }
  main.setAttribute("aria-busy", "true");
  let content;
  try {
    if (!view) throw new ApiError(404, { detail: "The console has no such page." });
    content = await view.render({ params, query, signal: controller.signal, rerender: render });
  } catch (error) {
    if (controller.signal.aborted) return;
    content = failure(error);
  }
  if (controller.signal.aborted) return;
  main.removeAttribute("aria-busy");
  main.replaceChildren(content);
  const heading = main.querySelector("h1");
  if (heading) { heading.setAttribute("tabindex", "-1"); heading.focus({ preventScroll: true }); }
}

export function failure(error) {
  if (error instanceof ApiError && error.status === 401) return keyView.form("This server needs an API key.");
  if (error instanceof ApiError && error.status === 404) {
    return h("section", { class: "not-found" }, h("h1", {}, "404 · Not found"),
      h("p", {}, error.message),
      h("p", {}, h("a", { href: "#/threads" }, "Back to the threads")));
  }
  const what = error instanceof ApiError ? `${error.status} ${error.code || ""}: ${error.message}` : String(error && error.message || error);
  return h("section", {}, h("h1", {}, "Something went wrong"), notice("error", what));
}

window.addEventListener("console:key-needed", () => {
  if (!main.querySelector("form.key-form")) main.replaceChildren(keyView.form("This server needs an API key."));
});
window.addEventListener("hashchange", render);
document.addEventListener("keydown", (event) => {
  // "/" jumps to the page's search field, as in most consoles.
  if (event.key === "/" && !["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement?.tagName)) {
    const search = main.querySelector("input[type=search], input");
    if (search) { event.preventDefault(); search.focus(); }
  }
});
render();
