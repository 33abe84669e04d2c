// MCP servers: names, types, state, last connected. Secrets are never asked for
// (`include_secrets` is never sent) and only their names are shown.
import { get } from "../api.js";
import { h, link, notice, route, table, text, time, field } from "../dom.js";
import { jsonView } from "../json.js";

const secretNames = (s) => {
  const names = Object.keys(s.secrets || {});
  return names.length ? [h("span", { class: "muted" }, `${names.length}: `), text(names.join(", "), { limit: 200 })] : h("span", { class: "muted" }, "none");
};

async function list({ query, signal }) {
  const page = await get("/v1/mcp-servers", { limit: 50, cursor: query.get("cursor"), server_type: query.get("server_type") || undefined }, { signal });
  const type = h("input", { type: "search", name: "server_type", value: query.get("server_type") || "", placeholder: "server type", autocomplete: "off", spellcheck: "false" });
  const submit = (event) => { event.preventDefault(); window.location.hash = route(["mcp-servers"], { server_type: type.value.trim() || undefined }); };
  const rows = page.data.map((s) => h("tr", {},
    h("td", {}, link(["mcp-servers", s.server_name], {}, text(s.server_name))),
    h("td", {}, text(s.server_type)), h("td", { class: "num" }, String(s.revision)),
    h("td", {}, time(s.last_connected_at)), h("td", {}, time(s.updated_at)), h("td", {}, secretNames(s))));
  const base = Object.fromEntries([...query.entries()].filter(([k]) => k !== "cursor"));
  return h("section", {}, h("h1", {}, "MCP servers"),
    h("form", { class: "filters", role: "search", on: { submit } }, field("Type", type), h("button", { type: "submit" }, "Filter")),
    rows.length ? table(["Server", "Type", "Revision", "Last connected", "Updated", "Secrets (names only)"], rows) : notice("info", "No MCP servers."),
    h("nav", { class: "pager", "aria-label": "Pages" },
      query.get("cursor") ? link(["mcp-servers"], base, "First page") : null,
      page.has_more ? link(["mcp-servers"], { ...base, cursor: page.next_cursor }, "Next page →") : null));
}

async function one({ params, signal }) {
  const s = await get(`/v1/mcp-servers/${encodeURIComponent(params.name)}`, {}, { signal });
  return h("section", {},
    h("p", { class: "crumbs" }, link(["mcp-servers"], {}, "MCP servers"), " /"),
    h("h1", {}, text(s.server_name)),
    h("dl", { class: "facts" },
      h("dt", {}, "Type"), h("dd", {}, text(s.server_type)),
      h("dt", {}, "Revision"), h("dd", {}, String(s.revision)),
      h("dt", {}, "Last connected"), h("dd", {}, time(s.last_connected_at)),
      h("dt", {}, "Created"), h("dd", {}, time(s.created_at)),
      h("dt", {}, "Updated"), h("dd", {}, time(s.updated_at)),
      h("dt", {}, "Secrets"), h("dd", {}, secretNames(s), h("span", { class: "muted" }, " (values are never shown here)"))),
    h("h2", {}, "State"), jsonView(s.state),
    h("p", {}, link(["events"], { resource_prefix: `/v1/mcp-servers/${s.server_name}` }, "Its events")));
}

export default {
  nav: { href: "#/mcp-servers", label: "MCP servers", section: "mcp-servers" },
  routes: ["mcp-servers", "mcp-servers/:name"],
  render: (ctx) => (ctx.params.name ? one(ctx) : list(ctx)),
};
