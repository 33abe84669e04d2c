from __future__ import annotations

from typing import Annotated

from fastapi import Body, Depends, Path, Query, Request, Response
from fastapi.responses import JSONResponse

from app.core.errors import NotFound
from app.core.revisions import etag
from app.http.dependencies import (
    ConditionalRefreshingReader,
    ConditionalWriter,
    Reader,
    RefreshingReader,
)
from app.http.idempotency import IdempotencyDep
from app.http.preconditions import NOT_MODIFIED, conditional, json_with_etag, model_json
from app.http.problems import responses
from app.http.routing import DomainRouter
from app.store.addressing import Addressing, item_path
from app.store.schemas import (
    ItemOut,
    ItemPatch,
    ItemReplace,
    NamespacePage,
    NamespacesIn,
    SearchIn,
    SearchPage,
)
from app.store.service import StoreService, Written

router = DomainRouter(tags=["store"])

ITEM = "/v1/store/items/{namespace:path}/{key}"
_LABEL = r"[A-Za-z0-9_:@-][A-Za-z0-9._:@-]{0,254}"
MERGE_PATCH = {"application/merge-patch+json": {
    "schema": {"$ref": "#/components/schemas/ItemPatch"}}}
# POSTs that only read: the `read` scope is enough (tests/test_auth_matrix.py reads this).
READ_ONLY = {"x-agentstate-scope": "read"}
_SEGMENTS = ("Each label and the key written as a name: bytes outside `A-Z a-z 0-9 . _ : -` "
             "(and `@`, and a leading `.`) as `@XX`, upper-case hex (as "
             "`agentstate_client.ids.encode_id` writes them).")


async def _address(
    request: Request,
    namespace: Annotated[str, Path(
        pattern=rf"^{_LABEL}(/{_LABEL}){{0,9}}$",
        description=f"The namespace's labels joined by `/`, e.g. `users/42/memories`. "
                    f"{_SEGMENTS}")],
    key: Annotated[str, Path(pattern=rf"^{_LABEL}$", description="The item's key, encoded "
                                                                 "the same way.")],
) -> tuple[str, str]:
    """The item a URL names. An encoded `/` (`%2F`) is never a separator: no item has it
    (a label holding `/` writes it `@2F`)."""
    if b"%2f" in (request.scope.get("raw_path") or b"").lower():
        raise NotFound("No store item has %2F in its URL; a label's / is written @2F.")
    address = Addressing(request.app.state.settings)
    return address.path_namespace(namespace), address.path_key(key)


Address = Annotated[tuple[str, str], Depends(_address)]


def _answer(written: Written, address: tuple[str, str]) -> Response:
    headers: dict[str, str] = {}
    if written.replayed:
        headers["Idempotent-Replayed"] = "true"
    if written.body is None:
        return Response(status_code=written.status, headers=headers)
    headers["ETag"] = etag(written.body["revision"])
    if written.status == 201:
        headers["Location"] = item_path(*address)
    return JSONResponse(written.body, status_code=written.status, headers=headers)


@router.get(ITEM, response_model=ItemOut, responses={**responses(404), **NOT_MODIFIED},
            summary="Get a store item")
async def get_store_item(
    address: Address, response: Response, uow: ConditionalRefreshingReader,
    refresh_ttl: Annotated[bool, Query(
        description="Restart the item's time to live (when it has one).")] = False,
) -> Response:
    item = await StoreService(uow).get(*address, refresh_ttl=refresh_ttl)
    answer = conditional(response, item, item.revision, uow.preconditions)
    if isinstance(answer, Response):
        return answer
    return json_with_etag(item, item.revision)


@router.put(ITEM, response_model=ItemOut,
            responses={**responses(404, 409, 412, 428), 201: {"model": ItemOut}},
            summary="Create or replace a store item")
async def put_store_item(address: Address, body: ItemReplace, uow: ConditionalWriter,
                         idempotency: IdempotencyDep) -> Response:
    """201 with `Location` when it creates, else 200; `ETag` either way. Section 2 applies
    (`If-None-Match: *` creates only; an existing item needs `If-Match`)."""
    written = await StoreService(uow).put(*address, body, uow.preconditions, idempotency)
    return _answer(written, address)


@router.patch(ITEM, response_model=ItemOut, responses=responses(404, 409, 412, 428),
              openapi_extra={"requestBody": {"content": MERGE_PATCH}},
              summary="Merge-patch a store item (RFC 7396)")
async def patch_store_item(address: Address, body: Annotated[ItemPatch, Body()],
                           uow: ConditionalWriter, idempotency: IdempotencyDep) -> Response:
    written = await StoreService(uow).patch(*address, body, uow.preconditions, idempotency)
    return _answer(written, address)


@router.delete(ITEM, status_code=204, responses=responses(404, 409, 412, 428),
               summary="Delete a store item")
async def delete_store_item(address: Address, uow: ConditionalWriter,
                            idempotency: IdempotencyDep) -> Response:
    written = await StoreService(uow).delete(*address, uow.preconditions, idempotency)
    return _answer(written, address)


@router.post("/v1/store/items/search", response_model=SearchPage, responses=responses(),
             openapi_extra=READ_ONLY,
             summary="Search store items by namespace prefix, filter, text and vector")
async def search_store_items(body: SearchIn, uow: RefreshingReader) -> Response:
    """Without `query` or `vector`: the matching items, most recently updated first. With
    `query`: full-text relevance; with `vector`: similarity to it (exact; approximate, by
    HNSW, on a large index where Postgres has pgvector); with both:
    reciprocal rank fusion of the two rankings. Needs only the `read` scope."""
    return model_json(await StoreService(uow).search(body))


@router.post("/v1/store/namespaces", response_model=NamespacePage, responses=responses(),
             openapi_extra=READ_ONLY, summary="List the namespaces of store items")
async def list_store_namespaces(body: NamespacesIn, uow: Reader) -> NamespacePage:
    """Namespaces holding at least one live item, in label order, filtered by `prefix` and
    `suffix` (`*` matches any one label) and cut to `max_depth`. Needs only the `read`
    scope."""
    return await StoreService(uow).list_namespaces(body)


