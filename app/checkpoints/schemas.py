"""Checkpoint bodies. Bytes travel as `{"type": <tag>, "data": <base64>}` (LangGraph's
serializer yields a type tag and bytes); a list value may travel as its items."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    PlainSerializer,
    StringConstraints,
    model_validator,
)
from typing_extensions import TypedDict

from app.core.schemas import JsonObject, Name, RowModel, Strict, Timestamp


def _b64decode(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise ValueError("must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("must be standard base64") from None


def _b64encode(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


# Bytes as standard base64 in JSON, both ways.
Base64 = Annotated[bytes, BeforeValidator(_b64decode),
                   PlainSerializer(_b64encode, return_type=str, when_used="json")]
Tag = Annotated[str, StringConstraints(min_length=1, max_length=255)]
Namespace = Annotated[str, StringConstraints(max_length=1024, pattern=r"^[^\x00]*$")]
Channel = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
# A channel version as LangGraph has it: an integer, a float or a string, compared as sent
# (its stored key, `version_key`, has at most 255 characters).
Version = (Annotated[int, Field(ge=-(10**18), le=10**18)] | float
           | Annotated[str, StringConstraints(max_length=255)])
Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]


def version_key(version: Version) -> str:
    """The stored key of a channel version: a string as it is, a number as its JSON text."""
    if isinstance(version, str):
        return version
    return repr(version) if isinstance(version, float) else str(version)


class Bytes(Strict):
    type: Tag
    data: Base64


class ItemIn(Strict):
    """One item of a list value: its bytes, or only its digest when the thread holds it."""

    type: Tag | None = None
    data: Base64 | None = None
    digest: Digest | None = None

    @model_validator(mode="after")
    def _one_form(self) -> ItemIn:
        if (self.data is None) == (self.digest is None) or (self.data is None) != (
                self.type is None):
            raise ValueError('an item is {"type", "data"} or {"digest"}')
        return self


class ValueIn(Strict):
    """The value of one channel at one version: `data`, or `items` (a list value whose items
    are stored once per thread, by digest)."""

    channel: Channel
    version: Version
    type: Tag
    data: Base64 | None = None
    items: list[ItemIn] | None = None
    base_version: Version | None = Field(None, description=(
        "With `items`: the value is the list stored under this version of the channel (in "
        "the same namespace), followed by `items`; only what a list gained is sent."))

    @model_validator(mode="after")
    def _one_form(self) -> ValueIn:
        if (self.data is None) == (self.items is None):
            raise ValueError('a value has either "data" or "items"')
        if self.base_version is not None and self.items is None:
            raise ValueError('"base_version" goes with "items"')
        return self


class CheckpointIn(Strict):
    checkpoint_ns: Namespace = ""
    checkpoint_id: Name
    parent_checkpoint_id: Name | None = None
    checkpoint: JsonObject = Field(description=(
        "The checkpoint without its channel values; `channel_versions` (an object of channel "
        "to version) says which stored value of each channel it holds."))
    metadata: JsonObject = Field(default_factory=dict)
    values: list[ValueIn] = Field(default_factory=list, description=(
        "The channel values this checkpoint adds (only the channels whose version is new)."))


class WriteIn(Strict):
    idx: int = Field(ge=-(2**31), lt=2**31)
    channel: Channel
    type: Tag
    data: Base64


class WritesIn(Strict):
    checkpoint_ns: Namespace = ""
    task_id: Annotated[str, StringConstraints(min_length=1, max_length=255)]
    task_path: Annotated[str, StringConstraints(max_length=2048)] = ""
    writes: list[WriteIn] = Field(max_length=10_000)


class TaskWritesIn(WritesIn):
    checkpoint_id: Name


class CheckpointBatchIn(Strict):
    checkpoints: list[CheckpointIn] = Field(default_factory=list, max_length=100, description=(
        "Checkpoints, stored in this order as `POST .../checkpoints` stores each."))
    writes: list[TaskWritesIn] = Field(default_factory=list, max_length=100, description=(
        "Pending writes of tasks, each against its `checkpoint_id`, stored after the "
        "checkpoints as `POST .../checkpoints/{checkpoint_id}/writes` stores them."))


class PruneIn(Strict):
    keep: int = Field(ge=0, le=1_000_000, description=(
        "Checkpoints kept per namespace, newest first; 0 deletes them all."))


class CopyIn(Strict):
    thread_id: Name = Field(description="The thread the checkpoints are copied to (created "
                                        "if it does not exist).")


class DeleteRunsIn(Strict):
    run_ids: list[Annotated[str, StringConstraints(min_length=1, max_length=255)]] = Field(
        max_length=1000)


class CheckpointRef(RowModel):
    """What a create answers: the key of the stored checkpoint."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    created_at: Timestamp


class CheckpointBatchRef(CheckpointRef):
    replayed: bool = Field(description="Stored before with the same content (a replay).")


class CheckpointBatchOut(Strict):
    checkpoints: list[CheckpointBatchRef]
    writes: int = Field(description="How many pending writes were sent.")


# A dict, not a model: a read of a 400-message log builds and serialises no model per item.
class CheckpointItemOut(TypedDict):
    """An item of a list value: its type tag, and its bytes in standard base64."""

    type: str
    data: str


class DigestItemOut(CheckpointItemOut):
    """An item in answers to `items`, with its digest."""

    digest: str


def item_out(type_: str, data: bytes) -> CheckpointItemOut:
    return {"type": type_, "data": _b64encode(data)}


class ValueOut(Strict):
    type: str
    data: Base64 | None = None
    items: list[CheckpointItemOut] | None = None
    digests: list[str] | None = Field(None, description=(
        "With `?items=digests`: the items' digests in order, instead of `items`."))


class ItemsIn(Strict):
    digests: list[Digest] = Field(max_length=5000)


class ItemsOut(BaseModel):
    data: list[DigestItemOut]


class WriteOut(Strict):
    task_id: str
    idx: int
    channel: str
    type: str
    data: Base64
    task_path: str


class CheckpointOut(Strict):
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint: JsonObject
    metadata: JsonObject
    values: dict[str, ValueOut] = Field(description=(
        "The value of every channel in `checkpoint.channel_versions` that has one."))
    pending_writes: list[WriteOut] = Field(description=(
        "Sorted by (task_path, task_id, idx), the order a graph runtime applies them in."))
    created_at: Timestamp


class DeltaWriteOut(Strict):
    checkpoint_id: str = Field(description="The ancestor the write is stored against.")
    task_id: str
    idx: int
    type: str
    data: Base64
    task_path: str


class ChannelHistoryOut(Strict):
    writes: list[DeltaWriteOut] = Field(description=(
        "The channel's pending writes on the parent chain since the seed (the seed "
        "checkpoint's own included, the target's not), oldest checkpoint first, then in "
        "(task_path, task_id, idx) order."))
    seed: ValueOut | None = Field(description=(
        "The value stored at the nearest ancestor that stores one for the channel; null if "
        "the walk reached the root without finding one, or if it is the seed a `known_seed` "
        "of the request names (`seed_digest` then says which)."))
    seed_digest: str | None = Field(None, description=(
        "The seed's digest (hex sha256 of its stored form), null when there is no seed. "
        "Name it in `known_seed` on a later read and the same seed is not sent again."))


class DeltaHistoryOut(Strict):
    checkpoint_id: str = Field(description="The checkpoint whose ancestors were walked.")
    channels: dict[str, ChannelHistoryOut]


class LatestCheckpointOut(CheckpointOut):
    delta_history: dict[str, ChannelHistoryOut] | None = Field(default=None, description=(
        "With `delta_channel`: each of those channels' delta history of this checkpoint, "
        "as `GET .../checkpoints/{checkpoint_id}/delta-history` answers it, read in the "
        "same transaction; null without."))


class Counted(Strict):
    count: int
