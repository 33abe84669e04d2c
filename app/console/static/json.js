// JSON as the API sent it, parsed and shown without loss or risk.
//
// `parseJson` keeps every number as written (a 64-bit id, `2.0`, `-0.0`) by reading its
// source text. `jsonView` renders a value as formatted JSON whose objects and arrays fold:
// deep or large ones start folded and their members are built only when opened, in chunks,
// so a 10 MB value or 60 levels of nesting cost nothing until someone looks.
import { h, text, formatBytes, formatCount, utf8Length } from "./dom.js";

export class RawNumber {
  constructor(source) { this.source = source; }
  toString() { return this.source; }
}

export function parseJson(source) {
  return JSON.parse(source, function (key, value, context) {
    if (typeof value === "number" && context && typeof context.source === "string" &&
        String(value) !== context.source) {
      return new RawNumber(context.source);
    }
    return value;
  });
}

export function isContainer(value) {
  return value !== null && typeof value === "object" && !(value instanceof RawNumber);
}

/** JSON text of a value, numbers as written (for sizes and comparisons). */
export function stringify(value) {
  if (value instanceof RawNumber) return value.source;
  if (Array.isArray(value)) return "[" + value.map(stringify).join(",") + "]";
  if (isContainer(value)) {
    return "{" + Object.entries(value).map(([k, v]) => JSON.stringify(k) + ":" + stringify(v)).join(",") + "}";
  }
  return JSON.stringify(value);
}

const CHUNK = 200;
const OPEN_DEPTH = 3;
const OPEN_MEMBERS = 50;

export function jsonView(value, { open = OPEN_DEPTH } = {}) {
  return h("div", { class: "json" }, node(value, 0, open));
}

function node(value, depth, open) {
  if (value === null) return h("span", { class: "j-null" }, "null");
  if (value instanceof RawNumber || typeof value === "number") {
    return h("span", { class: "j-num" }, String(value));
  }
  if (typeof value === "boolean") return h("span", { class: "j-bool" }, String(value));
  if (typeof value === "string") {
    return h("span", { class: "j-str" }, "\u201c", text(value, { limit: 500 }), "\u201d");
  }
  return container(value, depth, open);
}

function container(value, depth, open) {
  const array = Array.isArray(value);
  const entries = array ? value.map((v, i) => [i, v]) : Object.entries(value);
  const [start, end] = array ? ["[", "]"] : ["{", "}"];
  if (entries.length === 0) return h("span", { class: "j-punct" }, start + end);
  const count = `${formatCount(entries.length)} ${array ? "item" : "key"}${entries.length === 1 ? "" : "s"}`;
  const size = depth === 0 ? null : approximateSize(value);
  const summary = h("summary", {}, h("span", { class: "j-punct" }, start),
    h("span", { class: "j-count" }, ` ${count}${size && size > 4096 ? ", " + formatBytes(size) : ""} `),
    h("span", { class: "j-punct j-close-folded" }, end));
  const details = h("details", { class: "j-box" }, summary);
  let built = false;
  const build = () => {
    if (built) return;
    built = true;
    const body = h("div", { class: "j-members" });
    details.append(body, h("span", { class: "j-punct" }, end));
    let shown = 0;
    const more = h("button", { type: "button", class: "more" });
    const step = () => {
      const next = entries.slice(shown, shown + CHUNK);
      for (const [key, member] of next) {
        body.append(h("div", { class: "j-row" },
          array ? h("span", { class: "j-index" }, String(key)) : h("span", { class: "j-key" }, text(key, { limit: 200 })),
          h("span", { class: "j-punct" }, ": "), node(member, depth + 1, open)));
      }
      shown += next.length;
      if (shown < entries.length) {
        more.textContent = `show ${formatCount(Math.min(CHUNK, entries.length - shown))} more of ${formatCount(entries.length - shown)}`;
        body.append(more);
      } else {
        more.remove();
      }
    };
    more.addEventListener("click", () => { more.remove(); step(); });
    step();
  };
  details.addEventListener("toggle", () => { if (details.open) build(); });
  if (depth < open && entries.length <= OPEN_MEMBERS && (size === null || size < 64 * 1024)) {
    details.open = true;
    build();
  }
  return details;
}

/** The size of a value's JSON, counted up to a bound (a 10 MB state is not serialised to
 * learn that it is big). */
export function approximateSize(value, bound = 1 << 30) {
  let total = 0;
  const stack = [value];
  while (stack.length && total < bound) {
    const v = stack.pop();
    if (typeof v === "string") total += utf8Length(v) + 2;
    else if (v instanceof RawNumber) total += v.source.length;
    else if (Array.isArray(v)) { total += 2 + v.length; for (const m of v) stack.push(m); }
    else if (isContainer(v)) {
      for (const [k, m] of Object.entries(v)) { total += utf8Length(k) + 4; stack.push(m); }
      total += 2;
    } else total += String(v).length;
  }
  return total;
}
