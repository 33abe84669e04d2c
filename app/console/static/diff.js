// The difference between two JSON values, member by member: each row is a JSON Pointer
// (RFC 6901) with what it held before and after. Objects are compared by key (in the order
// the newer value has them, then removed keys), arrays by index, anything else by its JSON
// text (so `2` and `2.0` differ, as their bytes do).
import { isContainer, stringify } from "./json.js";

export function pointer(parts) {
  return parts.length === 0 ? "" :
    "/" + parts.map((p) => String(p).replaceAll("~", "~0").replaceAll("/", "~1")).join("/");
}

/** [{path, kind: "added"|"removed"|"changed", before?, after?}] */
export function diff(before, after, path = [], out = []) {
  const bothArrays = Array.isArray(before) && Array.isArray(after);
  const bothObjects = isContainer(before) && isContainer(after) && !Array.isArray(before) && !Array.isArray(after);
  if (bothArrays) {
    const n = Math.max(before.length, after.length);
    for (let i = 0; i < n; i++) {
      if (i >= before.length) out.push({ path: pointer([...path, i]), kind: "added", after: after[i] });
      else if (i >= after.length) out.push({ path: pointer([...path, i]), kind: "removed", before: before[i] });
      else diff(before[i], after[i], [...path, i], out);
    }
  } else if (bothObjects) {
    for (const key of Object.keys(after)) {
      if (!Object.hasOwn(before, key)) out.push({ path: pointer([...path, key]), kind: "added", after: after[key] });
      else diff(before[key], after[key], [...path, key], out);
    }
    for (const key of Object.keys(before)) {
      if (!Object.hasOwn(after, key)) out.push({ path: pointer([...path, key]), kind: "removed", before: before[key] });
    }
  } else if (stringify(before) !== stringify(after)) {
    out.push({ path: pointer(path), kind: "changed", before, after });
  }
  return out;
}
