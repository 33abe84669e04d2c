// Every node of the console is built here. Data reaches the page only as text nodes
// (never innerHTML: the page's Trusted Types policy would refuse it anyway), attributes come
// from a fixed list, and links only ever point inside the console (`#/...`).

const ATTRIBUTES = new Set([
  "class", "id", "title", "role", "tabindex", "type", "name", "value", "placeholder", "for",
  "autocomplete", "spellcheck", "hidden", "disabled", "open", "checked", "colspan", "scope",
  "inputmode", "min", "max", "required", "aria-label", "aria-current", "aria-live",
  "aria-expanded", "aria-controls", "aria-selected", "aria-busy", "data-seq", "data-id",
]);

// Characters that would change how the text around them reads, or hide: C0/C1 controls
// (besides tab and newline), bidi embeddings, overrides, isolates and marks, zero-width
// characters, separators and the BOM. Each is shown as a visible, labelled token instead.
const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]/g;

/** `h("a", {href: "#/x", class: "c", on: {click}}, ...children)`; children: nodes, strings
 * (text), numbers, arrays, null/false (skipped). */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "on") {
      for (const [type, handler] of Object.entries(value)) el.addEventListener(type, handler);
    } else if (name === "href") {
      el.setAttribute("href", internalHref(value));
    } else if (ATTRIBUTES.has(name)) {
      el.setAttribute(name, value === true ? "" : String(value));
    } else {
      throw new Error(`attribute ${name} is not allowed`);
    }
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Only links into the console itself: a `javascript:` (or any other) URL can never be made. */
export function internalHref(value) {
  const href = String(value);
  if (!href.startsWith("#/")) throw new Error("only #/ links are made");
  return href;
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

export function codePoint(ch) {
  return "U+" + ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
}

const PREVIEW = 2000;
const STEP = 256 * 1024;

/** A stored string, inert and legible: its hidden characters as visible tokens, and a long
 * one collapsed to its start with its size and a way to read on. */
export function text(value, { limit = PREVIEW } = {}) {
  const s = String(value);
  const wrap = h("span", { class: "v" });
  if (s.length <= limit) return append(wrap, [visible(s)]);
  let shown = limit;
  const body = h("span", {}, visible(s.slice(0, shown)));
  const more = h("button", { type: "button", class: "more" });
  const label = () => {
    more.textContent = `… show more (${formatBytes(utf8Length(s))} in all, ` +
      `${formatCount(s.length - shown)} characters hidden)`;
  };
  label();
  more.addEventListener("click", () => {
    const next = Math.min(s.length, shown + STEP);
    body.append(visible(s.slice(shown, next)));
    shown = next;
    if (shown >= s.length) more.remove(); else label();
  });
  return append(wrap, [body, " ", more]);
}

/** The string as text nodes, with each hidden character replaced by a labelled token. */
export function visible(s) {
  const frag = document.createDocumentFragment();
  let last = 0;
  for (const match of s.matchAll(HIDDEN)) {
    if (match.index > last) frag.append(document.createTextNode(s.slice(last, match.index)));
    const token = codePoint(match[0]);
    frag.append(h("span", { class: "cc", title: `hidden character ${token}` }, token));
    last = match.index + match[0].length;
  }
  if (last < s.length) frag.append(document.createTextNode(s.slice(last)));
  return frag;
}

export function utf8Length(s) {
  let bytes = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) bytes += 1;
    else if (c < 0x800) bytes += 2;
    else if (c >= 0xd800 && c < 0xdc00 && i + 1 < s.length) { bytes += 4; i++; }
    else bytes += 3;
  }
  return bytes;
}

export function formatBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
  return `${(n / 1024 / 1024).toFixed(1)} MB`;
}

export function formatCount(n) {
  return Number(n).toLocaleString("en-US");
}

/** A timestamp as the API wrote it, with a readable local form as its title. */
export function time(iso) {
  if (!iso) return h("span", { class: "muted" }, "—");
  const local = new Date(iso);
  return h("time", { title: isNaN(local) ? undefined : local.toString() }, String(iso));
}

/** `#/a/b?x=1`: path segments encoded, query from an object (arrays repeat; undefined and
 * null are left out, "" is kept). */
export function route(segments, query = {}) {
  const path = "#/" + segments.map((s) => encodeURIComponent(String(s))).join("/");
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    for (const v of Array.isArray(value) ? value : [value]) {
      if (v !== undefined && v !== null) params.append(name, String(v));
    }
  }
  const qs = params.toString();
  return qs ? `${path}?${qs}` : path;
}

export function link(segments, query, ...children) {
  return h("a", { href: route(segments, query) }, ...children);
}

export function table(headers, rows, { caption } = {}) {
  return h("div", { class: "table-wrap" },
    h("table", {},
      caption ? h("caption", {}, caption) : null,
      h("thead", {}, h("tr", {}, headers.map((name) => h("th", { scope: "col" }, name)))),
      h("tbody", {}, rows)));
}

export function field(label, input) {
  return h("label", { class: "field" }, h("span", {}, label), input);
}

export function notice(kind, ...children) {
  return h("div", { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status" }, ...children);
}
