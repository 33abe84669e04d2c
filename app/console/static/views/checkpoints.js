// A thread's checkpoints (graph runtimes): newest first, by namespace, with parent links;
// one checkpoint with its metadata, channel values (sizes; bytes folded) and pending writes.
import { get, thread } from "../api.js";
import { field, formatBytes, formatCount, h, link, notice, route, table, text, time } from "../dom.js";
import { jsonView, stringify } from "../json.js";

const bytes = (b64) => (b64 ? formatBytes(Math.floor((b64.length * 3) / 4) - (b64.endsWith("==") ? 2 : b64.endsWith("=") ? 1 : 0)) : "—");
const ns = (value) => (value === "" ? h("span", { class: "muted" }, "(root)") : text(value));

function checkpointLink(threadId, id, namespace) {
  return link(["threads", threadId, "checkpoints", id], { ns: namespace }, text(id));
}

async function list(t, query, signal) {
  const namespace = query.get("ns");
  const metadata = query.get("metadata") || undefined;
  const page = await get(`${thread(t.thread_id)}/checkpoints`, {
    limit: 20, cursor: query.get("cursor"), checkpoint_ns: namespace ?? undefined, metadata, items: "digests",
  }, { signal });
  const nsInput = h("input", { type: "search", name: "ns", value: namespace ?? "", placeholder: "every namespace", autocomplete: "off", spellcheck: "false" });
  const metaInput = h("input", { type: "text", name: "metadata", value: metadata || "", placeholder: '{"source": "loop"}', autocomplete: "off", spellcheck: "false" });
  const all = h("input", { type: "checkbox", name: "all", checked: namespace === null });
  const submit = (event) => {
    event.preventDefault();
    window.location.hash = route(["threads", t.thread_id, "checkpoints"], {
      ns: nsInput.value || (all.checked ? undefined : ""), metadata: metaInput.value.trim() || undefined,
    });
  };
  const rows = page.data.map((c) => h("tr", {},
    h("td", {}, checkpointLink(t.thread_id, c.checkpoint_id, c.checkpoint_ns)),
    h("td", {}, ns(c.checkpoint_ns)),
    h("td", {}, c.parent_checkpoint_id ? checkpointLink(t.thread_id, c.parent_checkpoint_id, c.checkpoint_ns) : h("span", { class: "muted" }, "—")),
    h("td", {}, time(c.created_at)),
    h("td", { class: "num" }, formatCount(Object.keys(c.values).length)),
    h("td", { class: "num" }, formatCount(c.pending_writes.length)),
    h("td", { class: "preview" }, text(stringify(c.metadata), { limit: 120 }))));
  const base = Object.fromEntries([...query.entries()].filter(([k]) => k !== "cursor"));
  return h("div", {},
    h("form", { class: "filters", role: "search", on: { submit } },
      field("Namespace", nsInput), field("All namespaces", all), field("Metadata contains", metaInput), h("button", { type: "submit" }, "Filter")),
    rows.length ? table(["Checkpoint", "Namespace", "Parent", "Created", "Values", "Pending writes", "Metadata"], rows) : notice("info", "No checkpoints."),
    h("nav", { class: "pager", "aria-label": "Pages" },
      query.get("cursor") ? link(["threads", t.thread_id, "checkpoints"], base, "First page") : null,
      page.has_more ? link(["threads", t.thread_id, "checkpoints"], { ...base, cursor: page.next_cursor }, "Next page →") : null));
}

async function one(t, id, query, signal) {
  const namespace = query.get("ns") ?? "";
  const c = await get(`${thread(t.thread_id)}/checkpoints/${encodeURIComponent(id)}`, { checkpoint_ns: namespace, items: "digests" }, { signal });
  const values = Object.entries(c.values).map(([channel, v]) => h("tr", {},
    h("td", {}, text(channel)), h("td", {}, text(v.type)),
    h("td", {}, v.digests ? `list of ${formatCount(v.digests.length)} items` : bytes(v.data)),
    h("td", { class: "preview" }, v.digests ? text(v.digests.join(" "), { limit: 200 }) : text(v.data ?? "", { limit: 120 }))));
  const writes = c.pending_writes.map((w) => h("tr", {},
    h("td", {}, text(w.task_id)), h("td", { class: "num" }, String(w.idx)), h("td", {}, text(w.channel)),
    h("td", {}, text(w.type)), h("td", {}, text(w.task_path)), h("td", {}, bytes(w.data))));
  return h("div", {},
    h("p", {}, link(["threads", t.thread_id, "checkpoints"], {}, "All checkpoints"), " / ",
      link(["threads", t.thread_id, "checkpoints"], { ns: c.checkpoint_ns }, "this namespace")),
    h("h2", {}, "Checkpoint ", text(c.checkpoint_id)),
    h("dl", { class: "facts" },
      h("dt", {}, "Namespace"), h("dd", {}, ns(c.checkpoint_ns)),
      h("dt", {}, "Parent"), h("dd", {}, c.parent_checkpoint_id ? checkpointLink(t.thread_id, c.parent_checkpoint_id, c.checkpoint_ns) : "—"),
      h("dt", {}, "Created"), h("dd", {}, time(c.created_at))),
    h("h3", {}, "Metadata"), jsonView(c.metadata, { open: 2 }),
    h("h3", {}, "Checkpoint"), jsonView(c.checkpoint, { open: 1 }),
    h("h3", {}, "Channel values"), values.length ? table(["Channel", "Type", "Size", "Data"], values) : notice("info", "No values."),
    h("h3", {}, "Pending writes"), writes.length ? table(["Task", "Index", "Channel", "Type", "Task path", "Size"], writes) : notice("info", "No pending writes."));
}

export function checkpoints(t, id, query, signal) {
  return id ? one(t, id, query, signal) : list(t, query, signal);
}
