// The console's views, in navigation order. A view is one module: `routes` (hash path
// patterns, `:name` a parameter, `?` optional), `render(ctx)` returning a node, and `nav`
// when it has an entry in the bar.
import events from "./events.js";
import mcp from "./mcp.js";
import memory from "./memory.js";
import thread from "./thread.js";
import threads from "./threads.js";

export const VIEWS = [threads, thread, memory, events, mcp];
