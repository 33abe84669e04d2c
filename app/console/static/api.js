// The console's only way to the server: the public API, with the caller's own key.
//
// The key is kept in this tab's sessionStorage and sent as `Authorization: Bearer`; it never
// goes into a URL, the page or a log. Live views read `/v1/events/stream` with fetch()
// (EventSource cannot send the header) and resume with `Last-Event-ID`.
import { parseJson } from "./json.js";

const KEY = "agentstate.console.key";

export const key = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.code = problem.code || null;
    this.problem = problem;
  }
}

export function url(path, query = {}) {
  const target = new URL(path, location.origin);
  for (const [name, value] of Object.entries(query)) {
    for (const v of Array.isArray(value) ? value : [value]) {
      if (v !== undefined && v !== null) target.searchParams.append(name, String(v));
    }
  }
  return target;
}

function headers(accept) {
  const out = { Accept: accept };
  const token = key.get();
  if (token) out.Authorization = `Bearer ${token}`;
  return out;
}

async function failure(response) {
  let problem = {};
  try { problem = parseJson(await response.text()); } catch { /* not a problem document */ }
  if (response.status === 401) window.dispatchEvent(new CustomEvent("console:key-needed"));
  return new ApiError(response.status, problem && typeof problem === "object" ? problem : {});
}

/** GET a JSON resource: its body (numbers as written). */
export async function get(path, query = {}, { signal } = {}) {
  const response = await fetch(url(path, query), {
    headers: headers("application/json"), signal, credentials: "omit", cache: "no-store",
  });
  if (!response.ok) throw await failure(response);
  return parseJson(await response.text());
}

/** POST a JSON body to one of the API's reads that take a body (the store's search and
 * namespace listing: read scope, no write): its answer. `body` is JSON text (json.js
 * `stringify`, so numbers go as they were written). The console sends no other POST. */
export async function read(path, body, { signal } = {}) {
  const h = headers("application/json");
  h["Content-Type"] = "application/json";
  const response = await fetch(url(path), {
    method: "POST", headers: h, body, signal, credentials: "omit", cache: "no-store",
  });
  if (!response.ok) throw await failure(response);
  return parseJson(await response.text());
}

/** Every item of a list, following `next_cursor`, up to `max` items. */
export async function all(path, query = {}, { max = 1000, signal, until = Infinity } = {}) {
  const items = [];
  let cursor;
  for (;;) {
    const page = await get(path, { limit: 100, ...query, cursor }, { signal });
    items.push(...page.data);
    const past = page.data.length && page.data[page.data.length - 1].seq >= until;
    if (!page.has_more || items.length >= max || past) return { items, complete: !page.has_more };
    cursor = page.next_cursor;
  }
}

export const thread = (id) => `/v1/threads/${encodeURIComponent(id)}`;

/** The newest seq of the tenant's feed that matches `filters`, 0 when none does: found by
 * asking whether anything matches after a seq (an indexed read of at most one event),
 * doubling, then halving. The feed pages oldest first; this is where "newest" starts. */
export async function newestSeq(filters = {}, { signal } = {}) {
  const after = async (seq) => (await get("/v1/events", { ...filters, after: seq, limit: 1 }, { signal })).data[0];
  const first = await after(0);
  if (!first) return 0;
  let low = first.seq;  // an event matches at low
  let step = 64;
  let high = null;       // nothing matches after high
  while (high === null) {
    const found = await after(low + step);
    if (found) { low = found.seq; step *= 2; } else high = low + step;
  }
  while (high - low > 1) {  // invariant: a match at low, none after high
    const mid = Math.floor((low + high) / 2);
    const found = await after(mid);
    if (found) low = found.seq; else high = mid;
  }
  const last = await after(low);
  return last ? last.seq : low;
}

/** The last `count` events matching `filters` with a seq below `below` (oldest first),
 * read through growing windows of seqs (the feed pages oldest first only); `complete` when
 * nothing older is left. */
export async function eventsBefore(filters, below, count, { signal } = {}) {
  let window = count;
  for (;;) {
    const start = Math.max(0, below - 1 - window);
    const { items } = await all("/v1/events", { ...filters, after: start }, { max: Infinity, signal, until: below });
    const inside = items.filter((e) => e.seq < below);
    if (inside.length >= count || start === 0) {
      return { events: inside.slice(-count), complete: start === 0 && inside.length <= count };
    }
    window *= 4;
  }
}

/** Watch `/v1/events/stream` from `after` (a seq) with `filters`, calling `onEvent(event)`
 * for each one and `onState(text)` as the connection comes and goes; reconnects with
 * `Last-Event-ID` until `signal` aborts. */
export async function watch(filters, after, { onEvent, onState, signal }) {
  let lastId = null;
  let delay = 500;
  while (!signal.aborted) {
    try {
      const h = headers("text/event-stream");
      if (lastId) h["Last-Event-ID"] = lastId;
      const response = await fetch(url("/v1/events/stream", { ...filters, ...(lastId ? {} : { after }) }), {
        headers: h, signal, credentials: "omit", cache: "no-store",
      });
      if (!response.ok) throw await failure(response);
      onState("live");
      delay = 500;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let id = null;
      let data = [];
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let newline;
        while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
          const line = buffer.slice(0, newline);
          buffer = buffer.slice(newline + (buffer.startsWith("\r\n", newline) ? 2 : 1));
          if (line === "") {
            if (data.length) {
              if (id !== null) lastId = id;
              onEvent(parseJson(data.join("\n")));
            }
            id = null;
            data = [];
          } else if (line.startsWith(":")) {
            continue;  // a keep-alive comment
          } else {
            const colon = line.indexOf(":");
            const name = colon < 0 ? line : line.slice(0, colon);
            let field = colon < 0 ? "" : line.slice(colon + 1);
            if (field.startsWith(" ")) field = field.slice(1);
            if (name === "id") id = field;
            else if (name === "data") data.push(field);
          }
        }
      }
      if (signal.aborted) return;
      onState("reconnecting");
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof ApiError && [400, 401, 403, 404, 406].includes(error.status)) {
        onState(`stopped: ${error.message}`);
        return;
      }
      onState("reconnecting");
    }
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 10000);
  }
}
