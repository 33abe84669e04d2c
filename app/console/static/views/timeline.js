// A thread's messages, newest page first and older pages on demand (a 100,000-message thread
// opens with one page like a 10-message one), live or full view, live-updated from the
// thread's events. Compacted runs fold behind their summary; removals and redactions appear
// as audit markers from the event log (the removed content is gone, and never shown).
import { all, get, newestSeq, thread, watch } from "../api.js";
import { formatCount, h, link, notice, text, time } from "../dom.js";
import { jsonView } from "../json.js";

const PAGE = 50;

function content(value) {
  if (value === null || value === undefined) return h("span", { class: "muted" }, "(no content)");
  if (typeof value === "string") return h("div", { class: "content" }, text(value));
  return jsonView(value, { open: 2 });
}

export function messageCard(m, threadId) {
  const facts = [
    h("span", { class: "seq", title: `position ${m.position}` }, `#${m.seq}`),
    h("span", { class: "role" }, text(m.role, { limit: 64 })),
    m.name ? h("span", { class: "muted" }, text(m.name, { limit: 100 })) : null,
    m.agent_name ? h("span", { class: "agent" }, "agent ", text(m.agent_name)) : null,
    m.status !== "live" ? h("span", { class: `badge s-${m.status}` }, m.status) : null,
    time(m.created_at),
    h("span", { class: "muted id" }, text(m.id)),
  ];
  const extra = [];
  if (m.tool_call_id) extra.push(h("div", {}, h("span", { class: "label" }, "tool_call_id "), text(m.tool_call_id)));
  if (m.tool_calls) extra.push(h("div", {}, h("span", { class: "label" }, "tool_calls"), jsonView(m.tool_calls, { open: 1 })));
  if (m.item !== undefined && m.item !== null) extra.push(h("div", {}, h("span", { class: "label" }, "item"), jsonView(m.item, { open: 1 })));
  if (m.metadata && Object.keys(m.metadata).length) extra.push(h("div", {}, h("span", { class: "label" }, "metadata"), jsonView(m.metadata, { open: 1 })));
  if (m.parent_id) extra.push(h("div", {}, h("span", { class: "label" }, "continues "), link(["threads", threadId, "lineage"], { message: m.id }, text(m.parent_id)), " (lineage)"));
  return h("article", { class: `message role-${/^[a-z]+$/.test(m.role) ? m.role : "other"}`, "data-id": m.id, "data-seq": m.seq },
    h("header", {}, facts), content(m.content), extra, h("div", { class: "audit" }));
}

function summaryFold(m, threadId, signal) {
  const fold = h("details", { class: "fold" }, h("summary", {}, "Summary of compaction ", text(m.compaction_id), ": show the messages it replaces"));
  fold.addEventListener("toggle", async () => {
    if (!fold.open || fold.dataset.id) return;
    fold.setAttribute("data-id", m.compaction_id);
    try {
      const detail = await get(`${thread(threadId)}/compactions/${encodeURIComponent(m.compaction_id)}`, {}, { signal });
      fold.append(h("p", { class: "muted" }, `${formatCount(detail.source_messages.length)} messages, reason: `, text(detail.reason ?? "—"), ", model: ", text(detail.model ?? "—")),
        ...detail.source_messages.map((s) => messageCard(s, threadId)));
    } catch (error) {
      fold.append(notice("error", error.message));
    }
  });
  return fold;
}

/** Cards for a page (ascending): compacted runs of the full view grouped in one fold. */
function cards(messages, threadId, view, signal) {
  const out = [];
  let run = null;
  for (const m of messages) {
    if (m.status === "compacted" && view === "full") {
      if (!run || run.id !== m.compaction_id) {
        run = { id: m.compaction_id, body: h("div", {}), count: 0 };
        run.label = h("span", {});
        out.push(h("details", { class: "fold compacted" }, h("summary", {}, run.label), run.body));
      }
      run.count += 1;
      run.label.textContent = `${formatCount(run.count)} compacted message${run.count === 1 ? "" : "s"} (compaction `;
      run.label.append(text(m.compaction_id), ")");
      run.body.append(messageCard(m, threadId));
      continue;
    }
    run = null;
    const card = messageCard(m, threadId);
    if (m.compaction_id && m.status === "live") card.append(summaryFold(m, threadId, signal));
    out.push(card);
  }
  return out;
}

export async function timeline(t, query, { signal, rerender }) {
  const view = query.get("view") === "full" ? "full" : "live";
  const path = `${thread(t.thread_id)}/messages`;
  const list = h("div", { class: "timeline" });
  const older = h("button", { type: "button", class: "more" }, "Load older messages");
  const state = h("span", { class: "live-state", "aria-live": "polite" });
  const shown = [];  // ascending
  let cursor = null;

  const first = await get(path, { view, order: "desc", limit: PAGE }, { signal });
  const place = (page, where) => {
    const ascending = page.data.slice().reverse();
    if (where === "top") { shown.unshift(...ascending); list.prepend(...cards(ascending, t.thread_id, view, signal)); }
    else { shown.push(...page.data); list.append(...cards(page.data, t.thread_id, view, signal)); }
  };
  place(first, "top");
  cursor = first.has_more ? first.next_cursor : null;
  older.hidden = !cursor;
  older.addEventListener("click", async () => {
    older.disabled = true;
    const page = await get(path, { view, order: "desc", limit: PAGE, cursor }, { signal });
    place(page, "top");
    cursor = page.has_more ? page.next_cursor : null;
    older.hidden = !cursor;
    older.disabled = false;
    markers();
  });

  // Audit markers: redactions on their message, removals where they happened in time.
  let audit = [];
  const markers = () => {
    list.querySelectorAll(".marker").forEach((el) => el.remove());
    for (const event of audit) {
      if (event.type === "message.redacted") {
        const id = decodeURIComponent(event.resource.split("/").pop());
        for (const card of list.querySelectorAll("article.message")) {
          if (card.dataset.id === id) {
            card.querySelector(".audit").append(h("p", { class: "marker redacted" }, `Redacted at revision ${event.revision} by `, text(event.actor), ", ", time(event.at), " (", link(["events", event.seq], {}, `event ${event.seq}`), ")"));
          }
        }
      } else if (event.type === "message.removed") {
        const after = [...list.children].filter((el) => el.matches("article.message, details.fold") &&
          (el.querySelector("time")?.textContent || "") <= event.at);
        const marker = h("div", { class: "marker removed", role: "note" }, "Messages removed at revision ", String(event.revision), " by ", text(event.actor), ", ", time(event.at), " (", link(["events", event.seq], {}, `event ${event.seq}`), "). Their content is gone; the gap in seqs is theirs.");
        if (after.length) after[after.length - 1].after(marker);
        else if (!cursor) list.prepend(marker);
      }
    }
  };
  all("/v1/events", { thread_id: t.thread_id, type: ["message.removed", "message.redacted"] }, { max: 1000, signal })
    .then(({ items }) => { audit = items; markers(); }).catch(() => {});

  // Live: new messages appended as their events arrive; anything that rewrites the view
  // (a compaction, a removal, a redaction) reloads it.
  // Live: new messages appended as their events arrive; anything that rewrites the view
  // (a compaction, a removal, a redaction) reloads it. The stream is set up after the page
  // is on screen; once it is live, one catch-up read covers what came in meanwhile.
  let catching = Promise.resolve();
  const catchUp = () => {
    catching = catching.then(async () => {
      const last = shown.length ? shown[shown.length - 1].position : 0;
      const { items } = await all(path, { view, order: "asc", after_seq: last }, { max: 10000, signal });
      const fresh = items.filter((m) => !shown.some((s) => s.seq === m.seq));
      place({ data: fresh }, "bottom");
      markers();
    }).catch(() => {});
  };
  const live = query.get("live") !== "0";
  if (live) {
    let connected = false;
    newestSeq({ thread_id: t.thread_id }, { signal }).then((since) => watch({ thread_id: t.thread_id }, since, {
      signal,
      onState: (s) => {
        state.textContent = s === "live" ? "● live" : s;
        state.className = `live-state ${s === "live" ? "on" : ""}`;
        if (s === "live" && !connected) { connected = true; catchUp(); }
      },
      onEvent: (event) => {
        if (event.type === "message.appended" || event.type === "thread.updated") catchUp();
        else if (/^(compaction|message)\./.test(event.type) || event.type === "thread.deleted") rerender();
      },
    })).catch(() => { state.textContent = "live updates unavailable"; });
  }

  const other = view === "live" ? "full" : "live";
  return h("div", {},
    h("p", { class: "toolbar" },
      `${formatCount(t.message_count)} live messages. Showing the ${view} view${view === "full" ? " (compacted and reverted messages too)" : ""}. `,
      link(["threads", t.thread_id, "messages"], { view: other }, `Switch to the ${other} view`), " · ",
      live ? link(["threads", t.thread_id, "messages"], { view, live: "0" }, "Stop live updates") : link(["threads", t.thread_id, "messages"], { view }, "Live updates"),
      " ", state),
    older, first.data.length ? list : notice("info", "No messages."));
}
