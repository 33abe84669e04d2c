"""`POST /v1/batch`: each operation is the use case of its single request, run by that
slice's service inside the request's one unit of work, in order.

This module is a composition root like `app/main.py` (docs/CONVENTIONS.md): it is the one
place besides the routers that calls other slices' services. Every operation takes the locks
and checks the preconditions its single request would; the transaction holds every lock until
the commit, so concurrent batches on the same thread serialise there and none loses an update.
The first operation that is refused raises, the request's transaction rolls back and nothing
of the batch is written; the problem names the operation by its index.
"""

from __future__ import annotations

import json
from typing import Any

from app.agent_states.service import AgentStateService
from app.batch.schemas import (
    AgentStateDelete,
    AgentStatePatchOp,
    AgentStatePut,
    BatchIn,
    BatchOut,
    MessagesAppend,
    MessagesRedact,
    MessagesRemove,
    OperationResult,
    StoreDelete,
    StoreGet,
    StoreListNamespaces,
    StorePatchOp,
    StorePut,
    StoreSearch,
    ThreadDelete,
    ThreadPatchOp,
    ThreadPut,
)
from app.core.errors import AppError, NotFound
from app.core.revisions import ETagList, Preconditions, etag
from app.db.base import AnyRow
from app.db.unit import UnitOfWork
from app.idempotency.service import IdempotencyRequest, IdempotencyService
from app.messages.service import MessageService
from app.store.service import StoreService
from app.threads.aggregate import ThreadAggregate
from app.threads.service import ThreadService


def _conditions(op: Any) -> Preconditions:
    return Preconditions(ETagList.parse("If-Match", getattr(op, "if_match", None)),
                         ETagList.parse("If-None-Match", getattr(op, "if_none_match", None)))


class BatchService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow

    async def run(self, body: BatchIn,
                  idempotency: IdempotencyRequest | None) -> tuple[dict[str, Any], bool]:
        """The response body, and whether it replays an earlier request with the same
        Idempotency-Key (scoped to the first operation's thread; to the tenant when the first
        operation is a store operation)."""
        first: str | None = getattr(body.operations[0], "thread_id", None)
        # All or nothing: an operation that would run alone in autocommit (a thread's
        # conditional PUT) must not commit before the others are judged.
        self.uow.together = len(body.operations) > 1
        keys = IdempotencyService(self.uow, "batch")
        replay = await keys.begin(first, idempotency)
        if replay is not None:
            return replay.body, True
        held = await self._lock_patched(body.operations)
        results = []
        for index, op in enumerate(body.operations):
            try:
                results.append(await self._apply(op, held))
            except AppError as exc:
                exc.detail = f"Operation {index} ({op.op}) was refused, nothing was written: " \
                             f"{exc.detail}"
                exc.extra = {**exc.extra, "operation": index}
                raise
        out = BatchOut(results=results).model_dump(mode="json")
        if idempotency is not None and first is None:
            await keys.save(None, idempotency, 200, out)
        elif idempotency is not None and first is not None:
            try:
                pk = await ThreadAggregate(self.uow).live_pk(first)
            except NotFound:  # the batch deleted it: there is nothing to keep the key with
                pass
            else:
                await keys.save(pk, idempotency, 200, out)
        return out, False

    async def _lock_patched(self, operations: list[Any]) -> dict[str, AnyRow | None]:
        """The threads whose first operation in the batch is a patch, read and locked in one
        statement, in `thread_id` order, before any operation runs (a patch reads its
        thread before it changes it). Each row is used by that first patch, which no earlier
        operation can have made stale; a thread's later operations read it again."""
        first: dict[str, Any] = {}
        for op in operations:
            if hasattr(op, "thread_id"):
                first.setdefault(op.thread_id, op)
        patched = [thread_id for thread_id, op in first.items() if isinstance(op, ThreadPatchOp)]
        if len(patched) < 2:  # one thread: its patch reads it itself, no statement saved
            return {}
        return await ThreadAggregate(self.uow).lock_all(patched)

    async def _apply(self, op: Any, held: dict[str, AnyRow | None]) -> OperationResult:
        uow, pre = self.uow, _conditions(op)
        if isinstance(op, ThreadPut):
            thread, created = await ThreadService(uow).replace(op.thread_id, op.body, pre)
            return OperationResult(status=201 if created else 200, etag=etag(thread.revision),
                                   body=json.loads(thread.json))
        if isinstance(op, ThreadPatchOp):
            thread = await ThreadService(uow).patch(op.thread_id, op.body, pre, held)
            return OperationResult(status=200, etag=etag(thread.revision),
                                   body=json.loads(thread.json))
        if isinstance(op, ThreadDelete):
            await ThreadService(uow).delete(op.thread_id, pre)
            return OperationResult(status=204)
        if isinstance(op, MessagesAppend):
            appended, _ = await MessageService(uow).append(
                op.thread_id, op.body.messages, pre, None)
            return OperationResult(status=201, etag=etag(appended["thread_revision"]),
                                   body=appended)
        if isinstance(op, MessagesRemove):
            removed = await MessageService(uow).remove(op.thread_id, op.body, pre)
            return OperationResult(status=200, etag=etag(removed.thread_revision),
                                   body=removed.model_dump(mode="json"))
        if isinstance(op, MessagesRedact):
            message, revision = await MessageService(uow).redact(
                op.thread_id, op.message_id, op.body, pre)
            return OperationResult(status=200, etag=etag(revision),
                                   body=message.model_dump(mode="json"))
        if op.op.startswith("store."):
            return await self._store(op, pre)
        states = AgentStateService(uow)
        if isinstance(op, AgentStatePut):
            state, created = await states.replace(op.thread_id, op.agent_name, op.body, pre)
            return OperationResult(status=201 if created else 200, etag=etag(state.revision),
                                   body=state.model_dump(mode="json"))
        if isinstance(op, AgentStatePatchOp):
            state = await states.patch(op.thread_id, op.agent_name, op.body, pre)
            return OperationResult(status=200, etag=etag(state.revision),
                                   body=state.model_dump(mode="json"))
        assert isinstance(op, AgentStateDelete)
        await states.delete(op.thread_id, op.agent_name, pre)
        return OperationResult(status=204)

    async def _store(self, op: Any, pre: Preconditions) -> OperationResult:
        store = StoreService(self.uow)
        if isinstance(op, StoreSearch):
            return OperationResult(status=200, body=(await store.search(op.body)).model_dump(
                mode="json"))
        if isinstance(op, StoreListNamespaces):
            return OperationResult(status=200, body=(await store.list_namespaces(
                op.body)).model_dump(mode="json"))
        namespace = "/".join(store.address.labels(op.namespace, "/namespace"))
        key = store.address.key(op.key, "/key")
        if isinstance(op, StoreGet):
            try:
                item = await store.get(namespace, key, refresh_ttl=op.refresh_ttl)
            except NotFound:
                return OperationResult(status=404)
            return OperationResult(status=200, etag=etag(item.revision),
                                   body=item.model_dump(mode="json"))
        if isinstance(op, StorePut):
            item, created = await store.replace(namespace, key, op.body, pre)
            return OperationResult(status=201 if created else 200, etag=etag(item.revision),
                                   body=item.model_dump(mode="json"))
        if isinstance(op, StorePatchOp):
            item = await store.merge(namespace, key, op.body, pre)
            return OperationResult(status=200, etag=etag(item.revision),
                                   body=item.model_dump(mode="json"))
        assert isinstance(op, StoreDelete)
        if op.missing_ok and not await store.exists(namespace, key):
            return OperationResult(status=404)
        await store.remove(namespace, key, pre)
        return OperationResult(status=204)
