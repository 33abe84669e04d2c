// Threads: find by id or metadata, order by creation or activity, page by cursor.
import { get } from "../api.js";
import { field, formatCount, h, link, notice, route, table, text, time } from "../dom.js";
import { parseJson, stringify } from "../json.js";

function search(query) {
  const ids = h("input", { type: "search", name: "thread_id", value: query.get("thread_id") || "", placeholder: "thread ids, comma-separated", autocomplete: "off", spellcheck: "false" });
  const metadata = h("input", { type: "text", name: "metadata", value: query.get("metadata") || "", placeholder: '{"team": "support"}', autocomplete: "off", spellcheck: "false" });
  const order = h("select", { name: "order_by" },
    h("option", { value: "" }, "newest created"),
    h("option", { value: "updated_at" }, "latest activity"));
  order.value = query.get("order_by") || "";
  const after = h("input", { type: "text", name: "updated_after", value: query.get("updated_after") || "", placeholder: "2026-01-01T00:00:00Z", autocomplete: "off" });
  const problem = h("p", { class: "field-error", role: "alert" });
  const submit = (event) => {
    event.preventDefault();
    problem.textContent = "";
    if (metadata.value.trim()) {
      try { parseJson(metadata.value); } catch { problem.textContent = "Metadata must be a JSON object."; return; }
    }
    window.location.hash = route(["threads"], {
      thread_id: ids.value.trim() || undefined, metadata: metadata.value.trim() || undefined,
      order_by: order.value || undefined, updated_after: after.value.trim() || undefined,
    });
  };
  return h("form", { class: "filters", role: "search", on: { submit } },
    field("Thread id", ids), field("Metadata contains", metadata), field("Order", order),
    field("Updated after", after), h("button", { type: "submit" }, "Search"), problem);
}

async function render({ query, signal }) {
  const params = {
    limit: 25, order_by: query.get("order_by") || undefined, metadata: query.get("metadata") || undefined,
    updated_after: query.get("updated_after") || undefined, cursor: query.get("cursor"),
    thread_id: (query.get("thread_id") || "").split(",").map((s) => s.trim()).filter(Boolean),
  };
  const page = await get("/v1/threads", params, { signal });
  const rows = page.data.map((t) => h("tr", {},
    h("td", {}, link(["threads", t.thread_id], {}, text(t.thread_id))),
    h("td", { class: "num" }, String(t.revision)),
    h("td", { class: "num" }, formatCount(t.message_count)),
    h("td", {}, time(t.updated_at)),
    h("td", {}, time(t.created_at)),
    h("td", { class: "preview" }, Object.keys(t.metadata).length ? text(stringify(t.metadata), { limit: 120 }) : h("span", { class: "muted" }, "—"))));
  const base = Object.fromEntries([...query.entries()].filter(([k]) => k !== "cursor"));
  return h("section", {},
    h("h1", {}, "Threads"),
    search(query),
    rows.length ? table(["Thread", "Revision", "Messages", "Updated", "Created", "Metadata"], rows)
      : notice("info", "No thread matches."),
    h("nav", { class: "pager", "aria-label": "Pages" },
      query.get("cursor") ? link(["threads"], base, "First page") : null,
      page.has_more ? link(["threads"], { ...base, cursor: page.next_cursor }, "Next page →") : null));
}

export default {
  nav: { href: "#/threads", label: "Threads", section: "threads" },
  routes: ["threads"],
  render,
};
