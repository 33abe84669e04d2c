"""The LangGraph SDK's store requests (API.md section 7b, "The LangGraph SDK's store") as the
store's own use cases: the same items, limits and errors as `/v1/store`, in the shapes
`langgraph_sdk`'s `client.store` sends and reads.

What differs is LangGraph's: a GET names the namespace by its labels joined with `.`; a
missing item reads as `null`; a delete of a missing item is not an error; `ttl` counts
minutes; answers carry no revision. And a write that sends no precondition overwrites
whatever is there (LangGraph's last writer wins), whatever `AGENTSTATE_REQUIRE_PRECONDITIONS`
says: the SDK has no way to send one but its `headers=`, which are honoured.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.core.errors import NotFound
from app.core.revisions import ETagList, Preconditions
from app.db.unit import UnitOfWork
from app.store.schemas import (
    ItemReplace,
    LangGraphDelete,
    LangGraphItem,
    LangGraphNamespaces,
    LangGraphPut,
    LangGraphSearchItem,
    LangGraphSearchPage,
    NamespacesIn,
    SearchIn,
)
from app.store.service import StoreService

MIN_TTL_SECONDS = 0.001  # the store's own floor (`TtlSeconds`)
# No item is ever at revision 0: a precondition that every existing item and no missing one
# meets (the client's `OVERWRITE`), so the write is unconditional and says so.
LAST_WRITER_WINS = Preconditions(if_none_match=ETagList.parse("If-None-Match", '"0"'))


def _or_overwrite(pre: Preconditions) -> Preconditions:
    return pre if pre.any_given else LAST_WRITER_WINS


class LangGraphStore:
    def __init__(self, uow: UnitOfWork) -> None:
        self.store = StoreService(uow)

    def _item(self, labels: Sequence[str], key: str) -> tuple[str, str]:
        """The stored namespace and key of labels and a key sent in a body."""
        address = self.store.address
        return "/".join(address.labels(labels, "/namespace")), address.key(key, "/key")

    async def put(self, body: LangGraphPut, pre: Preconditions) -> None:
        ttl = None if body.ttl is None else max(MIN_TTL_SECONDS, body.ttl * 60)
        replace = ItemReplace(value=body.value, index=body.index, ttl_seconds=ttl)
        await self.store.replace(*self._item(body.namespace, body.key), replace,
                                 _or_overwrite(pre))

    async def get(self, dotted: str, key: str, *, refresh_ttl: bool) -> LangGraphItem | None:
        """The item, or None (LangGraph answers a missing item with `null`)."""
        address = self.store.address
        namespace = "/".join(address.labels(dotted.split("."), "", parameter="namespace"))
        try:
            item = await self.store.get(namespace, address.key(key, "", parameter="key"),
                                        refresh_ttl=refresh_ttl)
        except NotFound:
            return None
        return LangGraphItem.of(item)

    async def delete(self, body: LangGraphDelete, pre: Preconditions) -> None:
        """Delete the item; one that does not exist is already deleted (as in LangGraph)."""
        try:
            await self.store.remove(*self._item(body.namespace, body.key), _or_overwrite(pre))
        except NotFound:
            return

    async def search(self, body: SearchIn) -> LangGraphSearchPage:
        page = await self.store.search(body)
        return LangGraphSearchPage(items=[LangGraphSearchItem.of(item) for item in page.data])

    async def list_namespaces(self, body: NamespacesIn) -> LangGraphNamespaces:
        page = await self.store.list_namespaces(body)
        return LangGraphNamespaces(namespaces=page.data)
