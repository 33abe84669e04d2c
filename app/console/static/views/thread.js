// One thread: its state, revisions (a diff between any two), timeline, agent states,
// compactions, checkpoints, events (live) and lineage, one tab each, each a shareable link.
import { ApiError, all, get, thread } from "../api.js";
import { field, formatCount, h, link, notice, route, table, text, time } from "../dom.js";
import { diff } from "../diff.js";
import { isContainer, jsonView } from "../json.js";
import { checkpoints } from "./checkpoints.js";
import { eventsPanel } from "./events.js";
import { messageCard, timeline } from "./timeline.js";

const TABS = [
  ["state", "State"], ["revisions", "Revisions"], ["messages", "Messages"], ["agents", "Agent states"],
  ["compactions", "Compactions"], ["checkpoints", "Checkpoints"], ["events", "Events"], ["lineage", "Lineage"],
];

function pager(segments, query, page) {
  const base = Object.fromEntries([...query.entries()].filter(([k]) => k !== "cursor"));
  return h("nav", { class: "pager", "aria-label": "Pages" },
    query.get("cursor") ? link(segments, base, "First page") : null,
    page.has_more ? link(segments, { ...base, cursor: page.next_cursor }, "Next page →") : null);
}

function stateTab(t) {
  return h("div", { class: "two" },
    h("section", {}, h("h2", {}, "State"), jsonView(t.state)),
    h("section", {}, h("h2", {}, "Metadata"), jsonView(t.metadata)));
}

function valueCell(value, present) {
  if (!present) return h("span", { class: "muted" }, "—");
  return isContainer(value) ? jsonView(value, { open: 1 }) : jsonView(value);
}

export function diffTable(changes) {
  if (!changes.length) return notice("info", "No difference: state and metadata are the same at both revisions.");
  return table(["Path", "Change", "Before", "After"], changes.map((c) => h("tr", { class: `d-${c.kind}` },
    h("td", { class: "path" }, text(c.path || "(the whole value)")),
    h("td", {}, h("span", { class: `badge d-${c.kind}` }, c.kind)),
    h("td", {}, valueCell(c.before, c.kind !== "added")),
    h("td", {}, valueCell(c.after, c.kind !== "removed")))));
}

async function revisionsTab(t, query, signal) {
  const path = `${thread(t.thread_id)}/revisions`;
  const page = await get(path, { limit: 50, cursor: query.get("cursor") }, { signal });
  const kept = page.data;
  const out = [];
  let a = query.get("a");
  let b = query.get("b");
  if (!a && !b && kept.length >= 2 && !query.get("show")) { a = String(kept[1].revision); b = String(kept[0].revision); }
  const picker = (name, value) => {
    const select = h("select", { name }, kept.map((r) => h("option", { value: r.revision }, `revision ${r.revision}`)));
    if (value) {
      if (![...select.options].some((o) => o.value === value)) select.prepend(h("option", { value }, `revision ${value}`));
      select.value = value;
    }
    return select;
  };
  const from = picker("a", a);
  const to = picker("b", b);
  const compare = (event) => {
    event.preventDefault();
    window.location.hash = route(["threads", t.thread_id, "revisions"], { a: from.value, b: to.value });
  };
  out.push(h("form", { class: "filters", on: { submit: compare } }, field("From", from), field("To", to), h("button", { type: "submit" }, "Compare")));
  if (a && b) {
    const [before, after] = await Promise.all([get(`${path}/${encodeURIComponent(a)}`, {}, { signal }), get(`${path}/${encodeURIComponent(b)}`, {}, { signal })]);
    const changes = diff({ state: before.state, metadata: before.metadata }, { state: after.state, metadata: after.metadata });
    out.push(h("section", { class: "diff" }, h("h2", {}, `Revision ${a} → ${b}: ${changes.length} change${changes.length === 1 ? "" : "s"}`),
      h("p", { class: "muted" }, `State written at revision ${before.state_revision} and ${after.state_revision}.`), diffTable(changes)));
  }
  const show = query.get("show");
  if (show) {
    const at = await get(`${path}/${encodeURIComponent(show)}`, {}, { signal });
    out.push(h("section", {}, h("h2", {}, `At revision ${at.revision} (state written at ${at.state_revision}, `, time(at.updated_at), ")"),
      h("div", { class: "two" }, h("div", {}, h("h3", {}, "State"), jsonView(at.state)), h("div", {}, h("h3", {}, "Metadata"), jsonView(at.metadata)))));
  }
  const rows = kept.map((r, i) => h("tr", {},
    h("td", { class: "num" }, link(["threads", t.thread_id, "revisions"], { show: r.revision }, String(r.revision))),
    h("td", { class: "num" }, String(r.state_revision)),
    h("td", {}, time(r.updated_at)),
    h("td", {}, kept[i + 1] ? link(["threads", t.thread_id, "revisions"], { a: kept[i + 1].revision, b: r.revision }, `diff with ${kept[i + 1].revision}`) : "—")));
  out.push(h("h2", {}, "Kept revisions"), rows.length ? table(["Revision", "State written at", "Updated", ""], rows) : notice("info", "This thread keeps no history (history_limit 0)."),
    pager(["threads", t.thread_id, "revisions"], query, page));
  return h("div", {}, out);
}

async function agentsTab(t, query, signal) {
  const page = await get(`${thread(t.thread_id)}/agents`, { limit: 50, cursor: query.get("cursor") }, { signal });
  if (!page.data.length) return notice("info", "No agent states in this thread.");
  return h("div", {}, page.data.map((s) => h("section", { class: "card" },
    h("h2", {}, text(s.agent_name)),
    h("p", { class: "muted" }, `revision ${s.revision} · updated `, time(s.updated_at), " · created ", time(s.created_at)),
    jsonView(s.state, { open: 2 }))), pager(["threads", t.thread_id, "agents"], query, page));
}

async function compactionsTab(t, query, signal) {
  const path = `${thread(t.thread_id)}/compactions`;
  const page = await get(path, { limit: 50, cursor: query.get("cursor") }, { signal });
  if (!page.data.length) return notice("info", "No live compactions (reverted ones leave the list; the event log keeps them).");
  return h("div", {}, page.data.map((c) => {
    const fold = h("details", { class: "fold" }, h("summary", {}, `Show the ${formatCount(c.source_message_ids.length)} messages it replaced`));
    fold.addEventListener("toggle", async () => {
      if (!fold.open || fold.dataset.id) return;
      fold.setAttribute("data-id", c.id);
      const detail = await get(`${path}/${encodeURIComponent(c.id)}`, {}, { signal });
      fold.append(...detail.source_messages.map((m) => messageCard(m, t.thread_id)));
    });
    return h("section", { class: "card" },
      h("h2", {}, text(c.id)),
      h("p", { class: "muted" }, `thread revision ${c.thread_revision} · `, time(c.created_at), " · reason ", text(c.reason ?? "—"), " · model ", text(c.model ?? "—"),
        ` · tokens ${c.input_token_count ?? "—"} → ${c.output_token_count ?? "—"}`),
      h("div", { class: "content" }, text(c.summary_text ?? "")),
      Object.keys(c.metadata || {}).length ? jsonView(c.metadata, { open: 1 }) : null, fold);
  }), pager(["threads", t.thread_id, "compactions"], query, page));
}

/** "Forked from <source> at <revision N>": the source thread and its state at N, linked. */
function forkedFrom(source) {
  return ["Forked from ", link(["threads", source.thread_id], {}, text(source.thread_id)), " at ",
    link(["threads", source.thread_id, "revisions"], { show: source.revision }, `revision ${source.revision}`)];
}

async function lineageTab(t, query, signal) {
  const out = [];
  const [forked, forks] = await Promise.all([
    all("/v1/events", { thread_id: t.thread_id, type: "thread.forked" }, { max: 100, signal }),
    get("/v1/threads", { forked_from: t.thread_id, limit: 25, cursor: query.get("cursor") }, { signal }),
  ]);
  // The source is linked above the tabs (`forkedFrom`); here, the fork's event (the log may
  // have let it go: retention).
  out.push(h("h2", {}, "Made by a fork"));
  out.push(forked.items.length
    ? h("ul", {}, forked.items.map((e) => h("li", {}, `Made by a fork at revision ${e.revision}, `, time(e.at), " by ", text(e.actor), " (", link(["events", e.seq], {}, `event ${e.seq}`), ")")))
    : t.forked_from ? h("p", {}, forkedFrom(t.forked_from), " (its event is no longer kept)")
      : h("p", { class: "muted" }, "This thread was not made by a fork."));
  out.push(h("h2", {}, "Forks"));
  const rows = forks.data.map((f) => h("tr", {},
    h("td", {}, link(["threads", f.thread_id], {}, text(f.thread_id))),
    h("td", { class: "num" }, link(["threads", t.thread_id, "revisions"], { show: f.forked_from.revision }, String(f.forked_from.revision))),
    h("td", {}, time(f.created_at)),
    h("td", {}, time(f.updated_at))));
  out.push(rows.length
    ? table(["Fork", "From revision", "Created", "Updated"], rows)
    : h("p", { class: "muted" }, query.get("cursor") ? "No more forks." : "No thread was forked from this one."),
  pager(["threads", t.thread_id, "lineage"], query, forks));
  out.push(h("p", { class: "muted" }, "A fork keeps its source's message ids, so a forked message's lineage names every thread that holds it."));

  let id = query.get("message");
  if (!id) {
    const firstPage = await get(`${thread(t.thread_id)}/messages`, { view: "full", order: "asc", limit: 1 }, { signal });
    id = firstPage.data[0]?.parent_id ? firstPage.data[0].id : null;
  }
  out.push(h("h2", {}, "Lineage"));
  const input = h("input", { type: "search", name: "message", value: id || "", placeholder: "message id", autocomplete: "off", spellcheck: "false" });
  out.push(h("form", { class: "filters", on: { submit: (e) => { e.preventDefault(); window.location.hash = route(["threads", t.thread_id, "lineage"], { message: input.value.trim() }); } } },
    field("Walk back from message", input), h("button", { type: "submit" }, "Walk")));
  if (!id) {
    out.push(h("p", { class: "muted" }, "The first message of this thread continues no other message. Open a message's lineage from the timeline, or name one."));
    return h("div", {}, out);
  }
  try {
    const page = await get(`/v1/messages/${encodeURIComponent(id)}/lineage`, { limit: 100 }, { signal });
    const threads = [...new Set(page.data.map((m) => m.thread_id))];
    out.push(h("p", {}, `${formatCount(page.data.length)} messages${page.has_more ? " (the last 100; older ones continue)" : ""} across ${threads.length} thread${threads.length === 1 ? "" : "s"}: `,
      threads.map((id, i) => [i ? " → " : "", link(["threads", id], {}, text(id))])));
    out.push(h("div", { class: "timeline" }, page.data.map((m) => h("div", {}, h("p", { class: "muted" }, "in ", link(["threads", m.thread_id, "messages"], {}, text(m.thread_id))), messageCard(m, m.thread_id)))));
  } catch (error) {
    if (!(error instanceof ApiError)) throw error;
    out.push(notice(error.status === 409 ? "info" : "error", error.message));
  }
  return h("div", {}, out);
}

async function render({ params, query, signal, rerender }) {
  const t = await get(thread(params.id), {}, { signal });
  const tab = params.tab || "state";
  if (!TABS.some(([name]) => name === tab)) throw new ApiError(404, { detail: "The thread has no such tab." });
  let body;
  if (tab === "state") body = stateTab(t);
  else if (tab === "revisions") body = await revisionsTab(t, query, signal);
  else if (tab === "messages") body = await timeline(t, query, { signal, rerender });
  else if (tab === "agents") body = await agentsTab(t, query, signal);
  else if (tab === "compactions") body = await compactionsTab(t, query, signal);
  else if (tab === "checkpoints") body = await checkpoints(t, params.sub, query, signal);
  else if (tab === "lineage") body = await lineageTab(t, query, signal);
  else {
    const panel = eventsPanel({ thread_id: t.thread_id }, { signal });
    await panel.ready;
    body = panel.el;
  }
  const facts = [`revision ${t.revision}`, `${formatCount(t.message_count)} messages`];
  if (t.history_limit !== undefined) facts.push(`keeps ${t.history_limit} revisions`);
  if (t.ttl_seconds !== undefined && t.ttl_seconds !== null) facts.push(`deleted ${t.ttl_seconds} s after its last write`);
  return h("section", { class: "thread" },
    h("p", { class: "crumbs" }, link(["threads"], {}, "Threads"), " /"),
    h("h1", {}, text(t.thread_id)),
    h("p", { class: "muted" }, facts.join(" · "), " · created ", time(t.created_at), " · updated ", time(t.updated_at)),
    t.forked_from ? h("p", { class: "forked-from" }, forkedFrom(t.forked_from)) : null,
    h("nav", { class: "tabs", "aria-label": "Thread" }, TABS.map(([name, label]) =>
      h("a", { href: route(["threads", t.thread_id, name]), "aria-current": name === tab ? "page" : undefined }, label))),
    h("div", { class: "tab-body" }, body));
}

export default {
  routes: ["threads/:id/:tab?/:sub?"],
  render,
};
