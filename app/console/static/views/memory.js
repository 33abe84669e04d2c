// Memory, the long-term store (docs/API.md section 7b): its namespaces by label prefix, one
// namespace's items (most recently updated first), lexical search with a filter (scores
// shown), and one item. Only reads: the namespace listing and the search are POSTs that need
// the read scope, and `refresh_ttl` is never sent, so looking never moves an expiry.
//
// A namespace is a path of labels and a label any string (slashes, dots, markup, bidi
// controls). In the API's URLs each label and key is written as the API writes it (bytes
// outside `A-Z a-z 0-9 . _ : -`, `@`, and a leading `.`, as `@XX`), the labels joined by `/`;
// the console's own links carry that same spelling as one hash segment (its `/` as `%2F`),
// and every label reaching the page is text.
import { ApiError, get, read } from "../api.js";
import { field, formatCount, h, link, notice, route, table, text, time } from "../dom.js";
import { isContainer, jsonView, parseJson, stringify } from "../json.js";

const PAGE = 25;
const SAFE = new Set([..."ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-"].map((c) => c.charCodeAt(0)));
const HEX = /^[0-9A-F]{2}$/;

/** A label or key as a URL segment, exactly as `agentstate_client.ids.encode_id` writes it. */
export function encodeLabel(label) {
  let out = "";
  new TextEncoder().encode(label).forEach((byte, index) => {
    out += SAFE.has(byte) && !(index === 0 && byte === 0x2e)
      ? String.fromCharCode(byte) : "@" + byte.toString(16).toUpperCase().padStart(2, "0");
  });
  return out;
}

/** The label a segment spells, or null when it is not the one spelling of any label. */
export function decodeLabel(segment) {
  const bytes = [];
  for (let i = 0; i < segment.length;) {
    if (segment[i] === "@") {
      const digits = segment.slice(i + 1, i + 3);
      if (!HEX.test(digits)) return null;
      bytes.push(parseInt(digits, 16));
      i += 3;
    } else {
      const code = segment.charCodeAt(i);
      if (!SAFE.has(code)) return null;
      bytes.push(code);
      i += 1;
    }
  }
  let label;
  try { label = new TextDecoder("utf-8", { fatal: true }).decode(new Uint8Array(bytes)); } catch { return null; }
  return label && encodeLabel(label) === segment ? label : null;
}

export const namespacePath = (labels) => labels.map(encodeLabel).join("/");

/** The labels of an encoded namespace (a hash segment), or a 404 for a spelling that names none. */
function labelsOf(path) {
  const labels = (path || "").split("/").map(decodeLabel);
  if (!path || labels.includes(null)) throw new ApiError(404, { detail: "That is not the spelling of a namespace (labels written @XX as the API writes them, joined by /)." });
  return labels;
}

/** A request body: JSON text of `fields` without the undefined ones (numbers as written). */
const body = (fields) => stringify(Object.fromEntries(Object.entries(fields).filter(([, v]) => v !== undefined)));

function offsetOf(query) {
  const n = Number(query.get("offset") || 0);
  return Number.isSafeInteger(n) && n >= 0 ? n : 0;
}

/** A namespace's labels, each in its own box, so a `/` inside a label never reads as a separator. */
export function labelsView(labels) {
  return h("span", { class: "ns" }, labels.map((label, i) => [
    i ? h("span", { class: "ns-sep" }, "/") : null, h("span", { class: "ns-label" }, text(label, { limit: 200 }))]));
}

const nsLink = (labels, children = labelsView(labels)) => link(["memory", "ns", namespacePath(labels)], {}, children);
const itemLink = (item) => link(["memory", "ns", namespacePath(item.namespace), encodeLabel(item.key)], {}, text(item.key, { limit: 200 }));

/** Labels typed in a field: a JSON array of strings, or text split at `/`. */
function typedLabels(value) {
  const s = value.trim();
  if (!s) return [];
  if (s.startsWith("[")) {
    let parsed;
    try { parsed = parseJson(s); } catch { return null; }
    return Array.isArray(parsed) && parsed.length && parsed.every((l) => typeof l === "string" && l) ? parsed : null;
  }
  const labels = s.split("/");
  return labels.every(Boolean) ? labels : null;
}

/** Labels back into the field: plain when `/` would read them back, else as JSON. */
function typedForm(labels) {
  if (!labels.length) return "";
  return labels.every((l) => l && !l.includes("/") && l.trim() === l) && !labels[0].startsWith("[")
    ? labels.join("/") : JSON.stringify(labels);
}

function pager(segments, query, hasMore) {
  const offset = offsetOf(query);
  const base = Object.fromEntries([...query.entries()].filter(([k]) => k !== "offset"));
  return h("nav", { class: "pager", "aria-label": "Pages" },
    offset > 0 ? link(segments, { ...base, offset: Math.max(0, offset - PAGE) || undefined }, "← Previous page") : null,
    hasMore ? link(segments, { ...base, offset: offset + PAGE }, "Next page →") : null);
}

function searchForm(query, scope) {
  const q = h("input", { type: "search", name: "q", value: query.get("q") || "", placeholder: "words to find", autocomplete: "off", spellcheck: "false" });
  const filter = h("textarea", { name: "filter", placeholder: '{"kind": "pref"}', autocomplete: "off", spellcheck: "false" });
  filter.value = query.get("filter") || "";
  const within = h("input", { type: "text", name: "prefix", value: typedForm(scope), placeholder: 'users/42 or ["users", "a/b"]', autocomplete: "off", spellcheck: "false" });
  const problem = h("p", { class: "field-error", role: "alert" });
  const submit = (event) => {
    event.preventDefault();
    problem.textContent = "";
    const labels = typedLabels(within.value);
    if (labels === null) { problem.textContent = "Namespace: labels joined by /, or a JSON array of non-empty strings."; return; }
    if (filter.value.trim()) {
      let parsed;
      try { parsed = parseJson(filter.value); } catch { parsed = null; }
      if (!isContainer(parsed) || Array.isArray(parsed)) { problem.textContent = "Filter must be a JSON object."; return; }
    }
    window.location.hash = route(["memory", "search"], {
      q: q.value.trim() || undefined, filter: filter.value.trim() || undefined,
      prefix: labels.length ? namespacePath(labels) : undefined,
    });
  };
  return h("form", { class: "filters", role: "search", on: { submit } },
    field("Search text", q), field("Filter (JSON)", filter), field("In namespace", within),
    h("button", { type: "submit" }, "Search"), problem);
}

/** A score to four significant digits (its title holds the digits the API sent); null: unscored. */
function score(value) {
  if (value === null || value === undefined) return "—";
  const n = Number(value);
  return n !== 0 && (Math.abs(n) < 1e-3 || Math.abs(n) >= 1e6) ? n.toExponential(3) : n.toPrecision(4);
}

function itemRows(items, { scored = false, under = 0 } = {}) {
  return items.map((item) => h("tr", {},
    h("td", {}, itemLink(item)),
    h("td", {}, item.namespace.length > under ? labelsView(item.namespace.slice(under)) : h("span", { class: "muted" }, "—")),
    scored ? h("td", { class: "num score", title: item.score ?? undefined }, score(item.score)) : null,
    h("td", { class: "num" }, String(item.revision)),
    h("td", {}, time(item.updated_at)),
    h("td", {}, time(item.expires_at)),
    h("td", { class: "preview" }, text(stringify(item.value), { limit: 160 }))));
}

const itemHeaders = (scored, under) => ["Key", under ? "Below" : "Namespace", ...(scored ? ["Score"] : []), "Revision", "Updated", "Expires", "Value"];

async function namespaces({ query, signal }) {
  const prefix = query.get("prefix") ? labelsOf(query.get("prefix")) : [];
  const offset = offsetOf(query);
  const page = await read("/v1/store/namespaces", body({ prefix: prefix.length ? prefix : undefined, limit: PAGE, offset }), { signal });
  const input = h("input", { type: "search", name: "prefix", value: typedForm(prefix), placeholder: 'users or ["users", "u/42"]', autocomplete: "off", spellcheck: "false" });
  const problem = h("p", { class: "field-error", role: "alert" });
  const submit = (event) => {
    event.preventDefault();
    const labels = typedLabels(input.value);
    if (labels === null) { problem.textContent = "Labels joined by /, or a JSON array of non-empty strings (* matches any one label)."; return; }
    window.location.hash = route(["memory"], { prefix: labels.length ? namespacePath(labels) : undefined });
  };
  const rows = page.data.map((labels) => h("tr", {},
    h("td", {}, nsLink(labels)), h("td", { class: "num" }, String(labels.length))));
  return h("section", { class: "memory" },
    h("h1", {}, "Memory"),
    h("p", { class: "muted" }, "The long-term store: items by namespace, outliving threads. Namespaces holding at least one live item, in label order."),
    h("form", { class: "filters", role: "search", on: { submit } },
      field("Namespace starts with", input), h("button", { type: "submit" }, "Filter"), problem),
    rows.length ? table(["Namespace", "Labels"], rows) : notice("info", offset ? "No more namespaces." : "No namespace matches."),
    pager(["memory"], query, page.has_more),
    h("h2", {}, "Search items"), searchForm(new URLSearchParams(), prefix));
}

async function items({ params, query, signal }) {
  const labels = labelsOf(params.namespace);
  const offset = offsetOf(query);
  const page = await read("/v1/store/items/search", body({ namespace_prefix: labels, limit: PAGE, offset }), { signal });
  const path = namespacePath(labels);
  return h("section", { class: "memory" },
    h("p", { class: "crumbs" }, link(["memory"], {}, "Memory"), " / ",
      labels.slice(0, -1).map((_, i) => [nsLink(labels.slice(0, i + 1), labelsView([labels[i]])), " / "])),
    h("h1", {}, labelsView(labels)),
    h("p", { class: "muted" }, `${labels.length} label${labels.length === 1 ? "" : "s"}. Its items and those of the namespaces below it, most recently updated first. `,
      link(["events"], { resource_prefix: `/v1/store/items/${path}/` }, "Their events")),
    searchForm(new URLSearchParams(), labels),
    page.data.length ? table(itemHeaders(false, labels.length), itemRows(page.data, { under: labels.length }))
      : notice("info", offset ? "No more items." : "No live item in this namespace (expired items are never shown)."),
    pager(["memory", "ns", path], query, page.has_more));
}

async function search({ query, signal }) {
  const prefix = query.get("prefix") ? labelsOf(query.get("prefix")) : [];
  const q = query.get("q") || undefined;
  let filter;
  if (query.get("filter")) {
    try { filter = parseJson(query.get("filter")); } catch { throw new ApiError(422, { detail: "The filter is not JSON." }); }
  }
  const offset = offsetOf(query);
  const page = await read("/v1/store/items/search", body({ namespace_prefix: prefix, query: q, filter, limit: PAGE, offset }), { signal });
  const how = q ? "Best match first (the score is the backend's text rank: comparable within one answer)." : "No text: most recently updated first.";
  return h("section", { class: "memory" },
    h("p", { class: "crumbs" }, link(["memory"], {}, "Memory"), " /"),
    h("h1", {}, "Search memory"),
    searchForm(query, prefix),
    h("p", { class: "muted" }, how, prefix.length ? [" Within ", nsLink(prefix), "."] : null),
    page.data.length ? table(itemHeaders(true, 0), itemRows(page.data, { scored: true }))
      : notice("info", offset ? "No more results." : "Nothing matches."),
    pager(["memory", "search"], query, page.has_more));
}

function indexFields(index) {
  if (index === false) return h("span", { class: "muted" }, "none: not searchable by text");
  if (index === null || index === undefined) return h("span", { class: "muted" }, "the whole value");
  return text(index.join(", "), { limit: 400 });
}

async function one({ params, signal }) {
  const labels = labelsOf(params.namespace);
  const key = decodeLabel(params.key);
  if (key === null) throw new ApiError(404, { detail: "That is not the spelling of a key (written @XX as the API writes it)." });
  const path = `/v1/store/items/${namespacePath(labels)}/${encodeLabel(key)}`;
  const item = await get(path, {}, { signal });
  return h("section", { class: "memory" },
    h("p", { class: "crumbs" }, link(["memory"], {}, "Memory"), " / ", nsLink(item.namespace), " /"),
    h("h1", {}, text(item.key, { limit: 200 })),
    h("dl", { class: "facts" },
      h("dt", {}, "Namespace"), h("dd", {}, nsLink(item.namespace)),
      h("dt", {}, "Key"), h("dd", {}, text(item.key)),
      h("dt", {}, "Revision"), h("dd", {}, String(item.revision)),
      h("dt", {}, "Created"), h("dd", {}, time(item.created_at)),
      h("dt", {}, "Updated"), h("dd", {}, time(item.updated_at)),
      h("dt", {}, "Expires"), h("dd", {}, item.expires_at ? [time(item.expires_at), h("span", { class: "muted" }, ` (${formatCount(item.ttl_seconds)} s after its last write)`)] : h("span", { class: "muted" }, "never")),
      h("dt", {}, "Searched by text"), h("dd", {}, indexFields(item.index)),
      h("dt", {}, "In the API"), h("dd", { class: "path" }, text(path))),
    h("h2", {}, "Value"), jsonView(item.value),
    h("p", {}, link(["events"], { resource_prefix: path }, "Its events")));
}

export default {
  nav: { href: "#/memory", label: "Memory", section: "memory" },
  routes: ["memory", "memory/ns/:namespace/:key?", "memory/:page"],
  render: (ctx) => {
    if (ctx.params.key) return one(ctx);
    if (ctx.params.namespace) return items(ctx);
    if (ctx.params.page === "search") return search(ctx);
    if (ctx.params.page) throw new ApiError(404, { detail: "Memory has no such page." });
    return namespaces(ctx);
  },
};
