// The change feed: the tenant's events (or one thread's), newest first, with a live tail
// over `/v1/events/stream`; `#/events/{seq}` is one event, a link that can be shared.
import { ApiError, eventsBefore, get, newestSeq, watch } from "../api.js";
import { field, h, link, notice, route, table, text, time } from "../dom.js";

const PAGE = 50;
export const TYPES = [
  "thread.created", "thread.updated", "thread.deleted", "thread.forked", "message.appended",
  "message.removed", "message.redacted", "compaction.created", "compaction.reverted",
  "agent_state.created", "agent_state.updated", "agent_state.deleted", "mcp_server.created",
  "mcp_server.updated", "mcp_server.deleted", "checkpoint.created", "checkpoint.writes_added",
  "checkpoint.deleted", "checkpoint.pruned", "checkpoint.copied", "checkpoint.runs_deleted",
  "store.item.created", "store.item.updated", "store.item.deleted", "store.item.expired",
];

function row(event) {
  return h("tr", { "data-seq": event.seq },
    h("td", { class: "num" }, link(["events", event.seq], {}, String(event.seq))),
    h("td", {}, time(event.at)),
    h("td", {}, h("span", { class: `badge t-${event.type.split(".")[0]}` }, text(event.type))),
    h("td", {}, event.thread_id ? link(["threads", event.thread_id], {}, text(event.thread_id)) : h("span", { class: "muted" }, "—")),
    h("td", { class: "preview" }, text(event.resource, { limit: 200 })),
    h("td", { class: "num" }, event.revision === null || event.revision === undefined ? "—" : String(event.revision)),
    h("td", {}, text(event.actor)));
}

/** A live list of the events matching `filters` (API names: thread_id, type, resource_prefix). */
export function eventsPanel(filters, { signal, live = true } = {}) {
  const el = h("div", { class: "events" });
  const list = table(["Seq", "At", "Type", "Thread", "Resource", "Revision", "Actor"], []);
  const body = list.querySelector("tbody");
  const status = h("span", { class: "live-state", "aria-live": "polite" }, "loading…");
  const older = h("button", { type: "button", class: "more", hidden: true }, "Load older events");
  const empty = notice("info", "No events yet.");
  empty.hidden = true;
  let oldest = null;
  let newest = 0;
  const seen = new Set();

  const add = (events, where) => {
    const fresh = events.filter((e) => !seen.has(e.seq));
    fresh.forEach((e) => seen.add(e.seq));
    const rows = fresh.slice().reverse().map(row);  // newest first
    if (where === "top") body.prepend(...rows); else body.append(...rows);
    empty.hidden = seen.size > 0;
  };
  const loadOlder = async () => {
    older.disabled = true;
    const { events, complete } = await eventsBefore(filters, oldest, PAGE, { signal });
    if (events.length) oldest = events[0].seq;
    add(events, "bottom");
    older.hidden = complete || events.length === 0;
    older.disabled = false;
  };
  older.addEventListener("click", () => loadOlder().catch((e) => { status.textContent = `error: ${e.message}`; }));

  const ready = (async () => {
    newest = await newestSeq(filters, { signal });
    oldest = newest + 1;
    await loadOlder();
    if (!live) { status.textContent = ""; return; }
    watch(filters, newest, {
      signal,
      onEvent: (event) => add([event], "top"),
      onState: (state) => { status.textContent = state === "live" ? "● live" : state; status.className = `live-state ${state === "live" ? "on" : ""}`; },
    });
  })();

  el.append(h("p", { class: "muted" }, "Newest first. ", status), list, empty, older);
  return { el, ready };
}

function filterForm(query) {
  const type = h("select", { name: "type" }, h("option", { value: "" }, "any type"), TYPES.map((t) => h("option", { value: t }, t)));
  type.value = query.get("type") || "";
  const thread = h("input", { type: "search", name: "thread_id", value: query.get("thread_id") || "", placeholder: "thread id", autocomplete: "off", spellcheck: "false" });
  const prefix = h("input", { type: "text", name: "resource_prefix", value: query.get("resource_prefix") || "", placeholder: "/v1/mcp-servers/", autocomplete: "off", spellcheck: "false" });
  const submit = (event) => {
    event.preventDefault();
    window.location.hash = route(["events"], { type: type.value || undefined, thread_id: thread.value.trim() || undefined, resource_prefix: prefix.value.trim() || undefined });
  };
  return h("form", { class: "filters", role: "search", on: { submit } },
    field("Type", type), field("Thread", thread), field("Resource starts with", prefix),
    h("button", { type: "submit" }, "Filter"));
}

async function feed({ query, signal }) {
  const filters = { type: query.get("type") || undefined, thread_id: query.get("thread_id") || undefined, resource_prefix: query.get("resource_prefix") || undefined };
  const panel = eventsPanel(filters, { signal });
  await panel.ready;
  return h("section", {}, h("h1", {}, "Change feed"), filterForm(query), panel.el);
}

async function one({ params, signal }) {
  const seq = Number(params.seq);
  if (!Number.isSafeInteger(seq) || seq < 1) throw new ApiError(404, { detail: "No event has that seq." });
  const [event] = (await get("/v1/events", { after: seq - 1, limit: 1 }, { signal })).data;
  if (!event || event.seq !== seq) throw new ApiError(404, { detail: `The feed holds no event ${seq} (removed by retention, or never written).` });
  const facts = [["Seq", String(event.seq)], ["At", time(event.at)], ["Type", text(event.type)],
    ["Thread", event.thread_id ? link(["threads", event.thread_id], {}, text(event.thread_id)) : "—"],
    ["Resource", text(event.resource)], ["Revision", event.revision ?? "—"], ["Actor", text(event.actor)]];
  return h("section", {},
    h("h1", {}, `Event ${event.seq}`),
    h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    h("p", {}, link(["events"], event.thread_id ? { thread_id: event.thread_id } : {}, "Events around it"),
      " · ", link(["events"], {}, "The whole feed")));
}

export default {
  nav: { href: "#/events", label: "Change feed", section: "events" },
  routes: ["events", "events/:seq"],
  render: (ctx) => (ctx.params.seq ? one(ctx) : feed(ctx)),
};
