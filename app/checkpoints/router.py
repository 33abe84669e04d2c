from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Query, Request, Response
from pydantic import StringConstraints
from starlette.convertors import Convertor, register_url_convertor

from app.checkpoints.schemas import (
    CheckpointBatchIn,
    CheckpointBatchOut,
    CheckpointIn,
    CheckpointOut,
    CheckpointRef,
    CopyIn,
    Counted,
    DeleteRunsIn,
    DeltaHistoryOut,
    ItemsIn,
    ItemsOut,
    LatestCheckpointOut,
    PruneIn,
    WritesIn,
)
from app.checkpoints.service import CheckpointService, checkpoints_path
from app.core.pagination import Page
from app.core.schemas import NAME_PATTERN
from app.http.dependencies import IfMatchWriter, Reader, Writer
from app.http.pagination import Cursor, Limit, linked
from app.http.params import ThreadId, json_object_param, name_path
from app.http.preconditions import model_json
from app.http.problems import responses
from app.http.routing import DomainRouter

router = DomainRouter(tags=["checkpoints"])

ItemsMode = Annotated[Literal["data", "digests"], Query(
    description="`digests`: list values carry their items' digests (`digests`) instead of "
                "the items; fetch the ones you do not hold with POST .../checkpoints/items.")]

BASE = "/v1/threads/{thread_id}/checkpoints"
CheckpointId = Annotated[str, name_path("Checkpoint id")]
# The words of the collection's own routes: `GET .../checkpoints/prune` is no checkpoint, so
# OPTIONS and 405 answer for the route that is there. (Checkpoints with these ids can be
# stored and listed, not read one by one.)
RESERVED = ("latest", "prune", "copy", "items", "batch")


class _CheckpointIdConvertor(Convertor[str]):
    regex = rf"(?!(?:{'|'.join(RESERVED)})$)[^/]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("checkpoint_id", _CheckpointIdConvertor())
ONE = BASE + "/{checkpoint_id:checkpoint_id}"
Namespace = Annotated[str, Query(max_length=1024, pattern=r"^[^\x00]*$", description='The namespace; "" (the root '
                                                               "graph) when omitted.")]


@router.post(BASE, status_code=201, response_model=CheckpointRef,
             responses={**responses(409, 410, 412, 413), 200: {"model": CheckpointRef}},
             summary="Store a checkpoint (creates the thread if needed)")
async def create_checkpoint(thread_id: ThreadId, body: CheckpointIn, response: Response,
                            uow: IfMatchWriter) -> CheckpointRef:
    """Immutable: the same content again is a replay (200), other content under the same
    (namespace, id) is 409 `checkpoint_exists`. 409 `checkpoint_items_missing` names items
    sent by digest that the thread does not hold."""
    ref, replayed = await CheckpointService(uow).create(thread_id, body, uow.preconditions)
    response.status_code = 200 if replayed else 201
    response.headers["Location"] = f"{checkpoints_path(thread_id)}/{ref.checkpoint_id}"
    return ref


@router.post(f"{BASE}/batch", responses=responses(409, 410, 412, 413),
             summary="Store checkpoints and pending writes in one transaction")
async def batch_checkpoints(thread_id: ThreadId, body: CheckpointBatchIn,
                            uow: IfMatchWriter) -> CheckpointBatchOut:
    """The checkpoints in order, then the writes, each as its own request stores it (a
    replay, a 409, the thread created if needed), in one transaction: all or nothing. A
    saver sends what it was asked to store meanwhile as one request."""
    return await CheckpointService(uow).batch(thread_id, body, uow.preconditions)


@router.get(BASE, responses=responses(404),
            summary="List a thread's checkpoints, newest first")
async def list_checkpoints(
    thread_id: ThreadId, request: Request, response: Response, uow: Reader,
    limit: Limit = 20, cursor: Cursor = None,
    checkpoint_ns: Annotated[str | None, Query(
        max_length=1024, pattern=r"^[^\x00]*$",
        description="One namespace; every namespace when omitted.")] = None,
    before: Annotated[str | None, Query(
        pattern=NAME_PATTERN, description="Only checkpoints with a smaller id.")] = None,
    metadata: Annotated[str | None, Query(
        description="JSON object; containment in `metadata` (@>).")] = None,
    items: ItemsMode = "data",
) -> Page[CheckpointOut]:
    page = await CheckpointService(uow).history(
        thread_id, ns=checkpoint_ns, before=before,
        metadata=json_object_param("metadata", metadata, uow.settings.max_json_depth),
        limit=limit, cursor=cursor,
        by_digest=items == "digests")
    return linked(request, response, page)


@router.delete(BASE, status_code=204, responses=responses(404, 410, 412),
               summary="Delete every checkpoint of a thread (the thread stays)")
async def delete_checkpoints(thread_id: ThreadId, uow: IfMatchWriter) -> Response:
    await CheckpointService(uow).delete_all(thread_id, uow.preconditions)
    return Response(status_code=204)


@router.post(f"{BASE}/prune", responses=responses(404, 410, 412),
             summary="Keep only the newest checkpoints of each namespace")
async def prune_checkpoints(thread_id: ThreadId, body: PruneIn, uow: IfMatchWriter) -> Counted:
    """`count`: how many checkpoints were deleted (with their writes, and the values no
    remaining checkpoint refers to)."""
    return Counted(count=await CheckpointService(uow).prune(thread_id, body.keep,
                                                            uow.preconditions))


@router.post(f"{BASE}/copy", responses=responses(404, 410, 412),
             summary="Copy a thread's checkpoints into another thread")
async def copy_checkpoints(thread_id: ThreadId, body: CopyIn, uow: IfMatchWriter) -> Counted:
    """The target is created if it does not exist; keys it already holds are kept.
    `count`: the checkpoints copied."""
    return Counted(count=await CheckpointService(uow).copy(thread_id, body.thread_id,
                                                           uow.preconditions))


ChannelName = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
Channels = Annotated[list[ChannelName], Query(alias="channel", max_length=32, description=(
    "A channel to walk for (repeat the parameter for more, at most 32)."))]
DeltaChannels = Annotated[list[ChannelName] | None, Query(
    alias="delta_channel", max_length=32, description=(
        "A channel whose delta history comes with the checkpoint, in `delta_history` (repeat "
        "for more, at most 32): one request where a LangGraph `DeltaChannel` would take two."))]
SeedDigest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
KnownSeeds = Annotated[list[SeedDigest] | None, Query(
    alias="known_seed", max_length=32, description=(
        "The `seed_digest` of a seed the client holds (repeat for more, at most 32): a "
        "channel whose seed has that digest answers `seed: null` with the digest, and the "
        "seed's items are not read or sent again."))]


# The reads answer their model's own JSON (`model_json`): a 400-message log is not
# validated again item by item on its way out.
@router.get(f"{BASE}/latest", response_model=LatestCheckpointOut,
            responses=responses(404, 414, 422),
            summary="Get the newest checkpoint of a namespace")
async def get_latest_checkpoint(thread_id: ThreadId, uow: Reader,
                                checkpoint_ns: Namespace = "",
                                items: ItemsMode = "data",
                                delta_channels: DeltaChannels = None,
                                known_seeds: KnownSeeds = None) -> Response:
    return model_json(await CheckpointService(uow).latest(
        thread_id, checkpoint_ns, by_digest=items == "digests", delta_channels=delta_channels,
        known_seeds=known_seeds or ()))


HISTORY = """Per channel: the pending writes on the checkpoint's parent chain since the nearest
ancestor that stores a value for the channel (oldest first; that ancestor's own writes
included, the checkpoint's not), and that value as `seed` (null if the walk reached the
root). What LangGraph's `get_delta_channel_history` answers, in one statement."""


@router.get(f"{BASE}/latest/delta-history", response_model=DeltaHistoryOut,
            responses=responses(404, 414, 422),
            summary="Delta channel history of the newest checkpoint of a namespace",
            description=HISTORY)
async def get_latest_delta_history(thread_id: ThreadId, uow: Reader,
                                   channels: Channels, checkpoint_ns: Namespace = "",
                                   items: ItemsMode = "data",
                                   known_seeds: KnownSeeds = None) -> Response:
    return model_json(await CheckpointService(uow).delta_history(
        thread_id, checkpoint_ns, None, channels, by_digest=items == "digests",
        known_seeds=known_seeds or ()))


@router.get(ONE + "/delta-history", response_model=DeltaHistoryOut,
            responses=responses(404, 414, 422),
            summary="Delta channel history of a checkpoint", description=HISTORY)
async def get_delta_history(thread_id: ThreadId, checkpoint_id: CheckpointId, uow: Reader,
                            channels: Channels,
                            checkpoint_ns: Namespace = "",
                            items: ItemsMode = "data",
                            known_seeds: KnownSeeds = None) -> Response:
    return model_json(await CheckpointService(uow).delta_history(
        thread_id, checkpoint_ns, checkpoint_id, channels, by_digest=items == "digests",
        known_seeds=known_seeds or ()))


@router.post(f"{BASE}/items", responses=responses(404),
             summary="Get list items by digest (what ?items=digests left out)")
async def get_checkpoint_items(thread_id: ThreadId, body: ItemsIn, uow: Writer) -> ItemsOut:
    """The thread's items with these digests; digests it does not hold are left out. A POST
    (thousands of digests do not fit a URL), so it takes the `write` scope like every POST;
    it changes nothing."""
    return ItemsOut(data=await CheckpointService(uow).items(thread_id, body.digests))


@router.get(ONE, response_model=CheckpointOut, responses=responses(404),
            summary="Get a checkpoint with its values and pending writes")
async def get_checkpoint(thread_id: ThreadId, checkpoint_id: CheckpointId, uow: Reader,
                         checkpoint_ns: Namespace = "",
                         items: ItemsMode = "data") -> Response:
    return model_json(await CheckpointService(uow).get(thread_id, checkpoint_ns, checkpoint_id,
                                                       by_digest=items == "digests"))


@router.post(ONE + "/writes", responses=responses(410, 412),
             summary="Store a task's pending writes (repeats ignored)")
async def put_checkpoint_writes(thread_id: ThreadId, checkpoint_id: CheckpointId, body: WritesIn,
                     uow: IfMatchWriter) -> Counted:
    """Keyed by (task_id, idx) within the checkpoint: a write whose key is stored is ignored,
    as graph runtimes expect. `count`: the writes sent."""
    return Counted(count=await CheckpointService(uow).put_writes(
        thread_id, checkpoint_id, body, uow.preconditions))


@router.post("/v1/checkpoints/delete-runs", responses=responses(),
             summary="Delete the checkpoints of runs (metadata run_id), in every thread")
async def delete_checkpoint_runs(body: DeleteRunsIn, uow: Writer) -> Counted:
    return Counted(count=await CheckpointService(uow).delete_runs(body.run_ids))
