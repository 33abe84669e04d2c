"""The store as the LangGraph SDK calls it: `langgraph_sdk.get_client(url=<server>/langgraph)`
and its `client.store.*` methods (API.md section 7b, "The LangGraph SDK's store").

The SDK's paths and bodies, onto the store's use cases (`langgraph_service.py`), with the
store's transactions, scopes and problem+json errors. The key may come as `x-api-key`, the
header the SDK sends (`app.http.dependencies.SDK_PREFIX`). Not in the OpenAPI document: the
SDK's own surface, which the SDK defines.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Response

from app.http.dependencies import ConditionalWriter, Reader, RefreshingReader
from app.http.problems import responses
from app.http.routing import DomainRouter
from app.store.langgraph_service import LangGraphStore
from app.store.schemas import (
    LangGraphDelete,
    LangGraphItem,
    LangGraphNamespaces,
    LangGraphPut,
    LangGraphSearchPage,
    NamespacesIn,
    SearchIn,
)

router = DomainRouter(prefix="/langgraph", tags=["store"],
                      include_in_schema=False)
ITEMS = "/store/items"


@router.put(ITEMS, status_code=204, responses=responses(409, 412, 428))
async def put_langgraph_store_item(body: LangGraphPut, uow: ConditionalWriter) -> Response:
    await LangGraphStore(uow).put(body, uow.preconditions)
    return Response(status_code=204)


@router.get(ITEMS, response_model=LangGraphItem | None, responses=responses())
async def get_langgraph_store_item(
    uow: RefreshingReader,
    namespace: Annotated[str, Query(description="The labels joined with `.`.")],
    key: Annotated[str, Query(min_length=1)],
    refresh_ttl: bool = False,
) -> LangGraphItem | None:
    """The item, or `null` when there is none."""
    return await LangGraphStore(uow).get(namespace, key, refresh_ttl=refresh_ttl)


@router.delete(ITEMS, status_code=204, responses=responses(409, 412, 428))
async def delete_langgraph_store_item(body: LangGraphDelete, uow: ConditionalWriter) -> Response:
    await LangGraphStore(uow).delete(body, uow.preconditions)
    return Response(status_code=204)


@router.post(f"{ITEMS}/search", response_model=LangGraphSearchPage, responses=responses())
async def search_langgraph_store_items(body: SearchIn,
                                       uow: RefreshingReader) -> LangGraphSearchPage:
    return await LangGraphStore(uow).search(body)


@router.post("/store/namespaces", response_model=LangGraphNamespaces, responses=responses())
async def list_langgraph_store_namespaces(body: NamespacesIn, uow: Reader) -> LangGraphNamespaces:
    return await LangGraphStore(uow).list_namespaces(body)
