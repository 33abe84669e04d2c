// The console's views, in navigation order. A view is one module: `routes` (hash path
// patterns, `:name` a parameter, `?` optional), `render(ctx)` returning a node, and `nav`
// when it has an entry in the bar. The Memory view plugs in here as views/memory.js.
import events from "./events.js";
import mcp from "./mcp.js";
import thread from "./thread.js";
import threads from "./threads.js";

export const VIEWS = [threads, thread, events, mcp];
