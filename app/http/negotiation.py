"""Content negotiation on `Accept` (RFC 9110 section 12.5.1), for the one route whose answer
is not JSON (`GET /v1/events/stream`).

Written out rather than taken from a library: Starlette and FastAPI have none, and
python-mimeparse, the small one, compares types case-sensitively, reads `q=abc` or `q=5` as
1 and raises on the first range it cannot parse.
"""

from __future__ import annotations

import re

# qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )
_QVALUE = re.compile(r"^(0(\.\d{0,3})?|1(\.0{0,3})?)$")


def accepts(fields: list[str], media_type: str) -> bool:
    """Whether a request's `Accept` field lines (all of them, as one list) allow
    `media_type`.

    No `Accept` (or an empty one) accepts anything. Otherwise the most specific range that
    matches decides (`text/event-stream;...` over `text/event-stream` over `text/*` over
    `*/*`), by its weight: `q=0` excludes. A range that does not parse (no `/`, a weight
    outside the grammar) is skipped; a header of nothing but those counts as none.
    """
    accept = ",".join(fields)
    kind, _, subtype = media_type.lower().partition("/")
    parsed = False
    best: tuple[int, float] | None = None  # (specificity, weight) of the best range so far
    for item in accept.split(","):
        name, *parameters = item.split(";")
        name = name.strip().lower()
        if name == "*":  # what Java's URLConnection sends
            name = "*/*"
        range_type, slash, range_subtype = name.partition("/")
        weight: float | None = 1.0
        extra = 0
        for parameter in parameters:
            key, _, value = parameter.strip().partition("=")
            if key.strip().lower() == "q":
                text = value.strip()
                weight = float(text) if _QVALUE.match(text) else None
            else:
                extra = 1
        if not slash or not range_type or not range_subtype or weight is None:
            continue
        parsed = True
        if (range_type, range_subtype) == (kind, subtype):
            specificity = 2 + extra
        elif (range_type, range_subtype) == (kind, "*"):
            specificity = 1
        elif (range_type, range_subtype) == ("*", "*"):
            specificity = 0
        else:
            continue
        if best is None or specificity > best[0]:
            best = (specificity, weight)
    if not parsed:  # no Accept, an empty one, or nothing in it that parses
        return True
    return best is not None and best[1] > 0
