"""`POST /v1/batch`: operations on threads, messages and agent states in one transaction."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictBool

from app.agent_states.schemas import AgentStatePatch, AgentStateReplace
from app.core.schemas import Name, Strict
from app.messages.schemas import MessageBatch, MessageRedaction, MessageRemoval
from app.store.schemas import ItemPatch, ItemReplace, Label, NamespacesIn, SearchIn
from app.threads.schemas import ThreadPatch, ThreadReplace

MAX_OPERATIONS = 100

IfMatch = Field(None, description="As the `If-Match` header of the single request: "
                                  "`\"<revision>\"`, a list of them, or `*`.")
IfNoneMatch = Field(None, description="`*`: create only (as the `If-None-Match` header).")


class _Operation(Strict):
    thread_id: Name
    if_match: str | None = IfMatch


class ThreadPut(_Operation):
    op: Literal["thread.put"]
    if_none_match: str | None = IfNoneMatch
    body: ThreadReplace


class ThreadPatchOp(_Operation):
    op: Literal["thread.patch"]
    body: ThreadPatch


class ThreadDelete(_Operation):
    op: Literal["thread.delete"]


class MessagesAppend(_Operation):
    op: Literal["messages.append"]
    body: MessageBatch


class MessagesRemove(_Operation):
    op: Literal["messages.remove"]
    body: MessageRemoval


class MessagesRedact(_Operation):
    op: Literal["messages.redact"]
    message_id: Name
    body: MessageRedaction


class _AgentOperation(_Operation):
    agent_name: Name


class AgentStatePut(_AgentOperation):
    op: Literal["agent_state.put"]
    if_none_match: str | None = IfNoneMatch
    body: AgentStateReplace


class AgentStatePatchOp(_AgentOperation):
    op: Literal["agent_state.patch"]
    body: AgentStatePatch


class AgentStateDelete(_AgentOperation):
    op: Literal["agent_state.delete"]


class _StoreItemOperation(Strict):
    namespace: list[Label] = Field(min_length=1, max_length=10,
                                   description="The item's namespace, as labels (not encoded).")
    key: Annotated[str, Field(min_length=1)] = Field(description="The item's key (not encoded).")


class _StoreWrite(_StoreItemOperation):
    if_match: str | None = IfMatch


class StorePut(_StoreWrite):
    op: Literal["store.put"]
    if_none_match: str | None = IfNoneMatch
    body: ItemReplace


class StorePatchOp(_StoreWrite):
    op: Literal["store.patch"]
    body: ItemPatch


class StoreDelete(_StoreWrite):
    op: Literal["store.delete"]
    missing_ok: StrictBool = Field(False, description=(
        "A missing item answers 404 in the results, whatever `if_match` says, instead of "
        "ending the batch."))


class StoreGet(_StoreItemOperation):
    """A read: 200 with the item, or 404 without a body (a miss does not end the batch)."""

    op: Literal["store.get"]
    refresh_ttl: StrictBool = False


class StoreSearch(Strict):
    op: Literal["store.search"]
    body: SearchIn


class StoreListNamespaces(Strict):
    op: Literal["store.list_namespaces"]
    body: NamespacesIn


Operation = Annotated[
    ThreadPut | ThreadPatchOp | ThreadDelete | MessagesAppend | MessagesRemove | MessagesRedact
    | AgentStatePut | AgentStatePatchOp | AgentStateDelete | StorePut | StorePatchOp
    | StoreDelete | StoreGet | StoreSearch | StoreListNamespaces,
    Field(discriminator="op"),
]


class BatchIn(Strict):
    operations: list[Operation] = Field(min_length=1, max_length=MAX_OPERATIONS, description=(
        "Applied in order in one transaction: all of them, or (when one is refused) none."))


class OperationResult(BaseModel):
    status: int = Field(description="What the single request would have answered: 200, 201, 204.")
    etag: str | None = Field(None, description="The resource's new ETag (for messages: the "
                                               "thread's).")
    body: Any = Field(None, description="The single request's response body (none for 204).")


class BatchOut(BaseModel):
    results: list[OperationResult]
