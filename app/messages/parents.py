"""Parent links (API.md section 4, "Parent links"): which stored message each `parent_id` of
an append names, decided under the locks that keep it there until the append commits.

Used by every write that appends (`POST .../messages`, a `PUT` with `append_messages`, their
batch operations), after the thread's revision was taken and the request's ids were checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.messages.errors import MessageAmbiguous, ParentNotFound
from app.messages.repository import MessageRepository, Parent
from app.messages.schemas import MessageIn


async def resolve_parents(repo: MessageRepository, thread: Any, messages: Sequence[MessageIn],
                          pointer: str) -> list[Parent | None]:
    """Where each message's `parent_id` points, as (thread id, seq); [] when none has one.

    `thread` is the row `advance` just returned (its `last_seq` is the request's last seq).
    A parent is a message of the tenant, in any thread, or an earlier message of this request;
    an id no message carries is 422 `parent_not_found`, one that several carry 409
    `message_ambiguous`. The threads holding the parents are held until commit (FOR SHARE on
    Postgres), and the parents read again under that hold, so a concurrent delete of one
    either happens before (and the parent is not found) or waits and then sees the link (and
    is refused with 409 `message_referenced`).
    """
    wanted = sorted({msg.parent_id for msg in messages if msg.parent_id is not None})
    if not wanted:
        return []
    first = thread.last_seq - len(messages) + 1
    in_request = {msg.id: index for index, msg in enumerate(messages) if msg.id is not None}
    found = await repo.carriers(wanted)
    others = {row.thread_pk for row in found if row.thread_pk != thread.id}
    if others:
        await repo.hold_threads(others)
        found = await repo.carriers(wanted)  # again, now that they cannot go away
    stored: dict[str, list[Parent]] = {}
    for row in found:
        stored.setdefault(row.message_id, []).append((row.thread_id, row.seq))
    parents: list[Parent | None] = []
    for index, msg in enumerate(messages):
        if msg.parent_id is None:
            parents.append(None)
            continue
        candidates = list(stored.get(msg.parent_id, []))
        earlier = in_request.get(msg.parent_id)
        if earlier is not None and earlier < index:
            candidates.append((thread.thread_id, first + earlier))
        if not candidates:
            later = " stored before it: it comes later in this request" if earlier is not None \
                else ""
            raise ParentNotFound(
                f"parent_id {msg.parent_id!r} names no message{later}; nothing was written.",
                errors=[{"pointer": f"{pointer}/{index}/parent_id", "code": "parent_not_found",
                         "message": "no such message"}])
        if len(candidates) > 1:
            raise MessageAmbiguous(
                f"parent_id {msg.parent_id!r} is carried by {len(candidates)} messages of "
                "the tenant (a forked thread keeps its source's ids); nothing was written.")
        parents.append(candidates[0])
    return parents
