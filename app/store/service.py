"""The store (API.md section 7b): items by namespace and key under section 2, search by
filter, text and vectors, and the namespaces in use."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from app.core.errors import NotFound, Unprocessable
from app.core.jsonutil import dumps
from app.core.mergepatch import merge_patch
from app.core.revisions import Preconditions, RevisionedResource, revision_of_tag
from app.db.base import AnyRow, utcnow
from app.db.unit import UnitOfWork
from app.idempotency.service import IdempotencyRequest, IdempotencyService
from app.store import pgvector, vectors
from app.store.addressing import Addressing, item_path, labels_of
from app.store.errors import TooManyVectors, ValueTooLarge, VectorDimsMismatch
from app.store.filters import parse_filter
from app.store.repository import Accept, Scope, StoreRepository
from app.store.schemas import (
    ItemOut,
    ItemPatch,
    ItemReplace,
    NamespacePage,
    NamespacesIn,
    SearchIn,
    SearchItemOut,
    SearchPage,
    VectorQuery,
)
from app.store.text import parse_path, query_tokens, search_text

ENDPOINT = "store"


@dataclass(frozen=True)
class Written:
    """A single write's answer: its status, its body (None for 204), whether it replays."""

    status: int
    body: dict[str, Any] | None
    replayed: bool
RRF_K = 60  # reciprocal rank fusion: 1 / (RRF_K + rank), as in the paper that named it
HYBRID_WINDOW = 100  # the best of each ranking a hybrid search fuses, at least


def scoped(request: IdempotencyRequest | None, method: str,
           path: str) -> IdempotencyRequest | None:
    """A store write's Idempotency-Key is the tenant's: its fingerprint covers the method and
    the item as well as the body, so a key reused on another item is refused, not replayed."""
    if request is None:
        return None
    digest = hashlib.sha256(f"{method} {path} {request.fingerprint}".encode()).hexdigest()
    return IdempotencyRequest(request.key, digest)


class StoreService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow
        self.settings = uow.settings
        self.now = utcnow()
        self.repo = StoreRepository(uow.connection, uow.tenant_id, self.now)
        self.address = Addressing(self.settings)

    # --- one item -----------------------------------------------------------------------

    def _resource(self, namespace: str, key: str) -> RevisionedResource:
        return RevisionedResource(
            self.repo, (namespace, key), noun="store item",
            label=f"Store item {item_path(namespace, key)!r}",
            required=self.settings.require_preconditions)

    def _event(self, change: str, namespace: str, key: str, revision: int) -> None:
        self.uow.record(f"store.item.{change}", item_path(namespace, key), revision=revision)

    def _expiry(self, ttl_ms: int | None) -> Any:
        return None if ttl_ms is None else self.now + timedelta(milliseconds=ttl_ms)

    def _content(self, value: dict[str, Any], index: list[str] | bool | None,
                 ttl_seconds: float | None) -> dict[str, Any]:
        """The stored columns of an item's content, after the value limit."""
        size = len(dumps(value).encode())
        if size > self.settings.store_max_value_bytes:
            raise ValueTooLarge(
                f"The value is {size} bytes as JSON; at most "
                f"{self.settings.store_max_value_bytes} (AGENTSTATE_STORE_MAX_VALUE_BYTES).",
                errors=[{"pointer": "/value", "code": "value_too_large",
                         "message": f"at most {self.settings.store_max_value_bytes} bytes"}])
        fields = [] if index is False else index if isinstance(index, list) else None
        for position, field in enumerate(fields or []):
            if parse_path(field) is None:
                raise Unprocessable(
                    f"index: {field!r} is not a field path such as \"text\", \"a.b\", "
                    "\"items[*].text\" or \"$\".",
                    errors=[{"pointer": f"/index/{position}", "code": "invalid_path",
                             "message": "not a field path"}])
        ttl_ms = None if ttl_seconds is None else max(1, round(ttl_seconds * 1000))
        return {"value": value, "index_fields": fields, "search_text": search_text(value, fields),
                "ttl_ms": ttl_ms, "expires_at": self._expiry(ttl_ms)}

    async def _vector_rows(self, vectors_in: dict[str, dict[str, list[float]]],
                           pointer: str) -> list[tuple[str, str, int, bytes]]:
        """The rows of an item's vectors, after the limits and the dimension of each index."""
        rows: list[tuple[str, str, int, bytes]] = []
        count = sum(len(fields) for fields in vectors_in.values())
        if count > self.settings.store_max_item_vectors:
            raise TooManyVectors(
                f"An item holds at most {self.settings.store_max_item_vectors} vectors "
                f"(AGENTSTATE_STORE_MAX_ITEM_VECTORS); {count} were sent.",
                errors=[{"pointer": pointer, "code": "too_many_vectors",
                         "message": f"at most {self.settings.store_max_item_vectors}"}])
        known = await self.repo.dims_of(list(vectors_in))
        for index, fields in vectors_in.items():
            where = f"{pointer}/{_escape(index)}"
            if not 0 < len(index) <= 255:
                raise Unprocessable(f"{where}: an index name has 1-255 characters.", errors=[
                    {"pointer": where, "code": "invalid_index", "message": "1-255 characters"}])
            dims = {len(embedding) for embedding in fields.values()}
            if len(dims) > 1 or (known.get(index) is not None and dims and
                                 dims != {known[index]}):
                held = known.get(index)
                raise VectorDimsMismatch(
                    f"{where}: the vectors of one index have one dimension"
                    + (f"; index {index!r} holds {held}-dimensional vectors (a new embedding "
                       "model is a new index name)" if held else "") + ".",
                    errors=[{"pointer": where, "code": "vector_dims_mismatch",
                             "message": f"holds {held} dimensions" if held else "mixed"}])
            for field, embedding in fields.items():
                at = f"{where}/{_escape(field)}"
                if not 0 < len(field) <= 255:
                    raise Unprocessable(f"{at}: a field name has 1-255 characters.", errors=[
                        {"pointer": at, "code": "invalid_field", "message": "1-255 characters"}])
                if not 0 < len(embedding) <= self.settings.store_max_vector_dims:
                    raise Unprocessable(
                        f"{at}: a vector has 1-{self.settings.store_max_vector_dims} "
                        "dimensions (AGENTSTATE_STORE_MAX_VECTOR_DIMS).",
                        errors=[{"pointer": at, "code": "vector_dims",
                                 "message": f"1-{self.settings.store_max_vector_dims}"}])
                rows.append((index, field, len(embedding), vectors.pack(embedding, at)))
        return rows

    async def exists(self, namespace: str, key: str) -> bool:
        try:
            await self._resource(namespace, key).get()
        except NotFound:
            return False
        return True

    async def get(self, namespace: str, key: str, *, refresh_ttl: bool = False) -> ItemOut:
        row = await self._resource(namespace, key).get()
        out = ItemOut.from_row(row)
        if refresh_ttl and row.ttl_ms is not None:
            expires = await self._refresh([row])
            out = out.model_copy(update={"expires_at": expires[row.id]})
        return out

    async def replace(self, namespace: str, key: str, body: ItemReplace,
                      pre: Preconditions) -> tuple[ItemOut, bool]:
        """Create or replace; returns the item and whether it was created."""
        content = self._content(body.value, body.index, body.ttl_seconds)
        rows = await self._vector_rows(body.vectors or {}, "/vectors")
        written = await self._write(namespace, key, content, pre)
        if written is not None:
            row, created = written
        else:  # a precondition to judge: the long way says what (or a create raced)
            row, created = await self._resource(namespace, key).put(
                pre, lambda _current: content, self.now)
            if not created:
                await self.repo.delete_vectors(namespace, key)
            self._event("created" if created else "updated", namespace, key, row.revision)
        await self.repo.insert_vectors(namespace, key, rows)
        return ItemOut.from_row(row), created

    async def _write(self, namespace: str, key: str, content: dict[str, Any],
                     pre: Preconditions) -> tuple[AnyRow, bool] | None:
        """A PUT as one statement (`StoreRepository.write`), its audit event included on
        Postgres: the write section 2 allows whatever the item's state, the preconditions
        put into SQL. None if the item's state needs judging (nothing was written)."""
        accept: Accept
        revisions: set[int] = set()
        if pre.if_match is not None:
            expected = pre.expected_revisions()
            if pre.if_none_match is not None or (expected is not None and not expected):
                return None  # both headers, or no tag names a revision (412 whatever)
            accept, revisions = ("live", set()) if expected is None else ("in", expected)
        elif pre.create_only or (self.settings.require_preconditions and not pre.any_given):
            accept = "none"  # an existing item answers 409 or 428
        elif pre.if_none_match is not None:
            accept = "not_in"
            revisions = {r for _weak, tag in pre.if_none_match.tags
                         if (r := revision_of_tag(tag)) is not None}
        else:
            accept = "any"
        resource = item_path(namespace, key)
        # The statement writes the event only if none is pending (events keep the order of
        # their changes, as in a batch).
        together = self.repo.postgres and all(event.stored for event in self.uow.events)
        row = await self.repo.write(
            (namespace, key), content, accept, sorted(revisions) or [0],
            (self.uow.principal.actor, resource) if together else None)
        if row is None:
            return None
        change = "created" if row.created else "updated"
        if together:
            self.uow.recorded(f"store.item.{change}", resource, revision=row.revision)
        else:
            self._event(change, namespace, key, row.revision)
        return row, bool(row.created)

    async def merge(self, namespace: str, key: str, body: ItemPatch,
                    pre: Preconditions) -> ItemOut:
        given = body.model_fields_set
        vectors_in = body.vectors or {}
        kept = {index: {f: e for f, e in fields.items() if e is not None}
                for index, fields in vectors_in.items() if fields is not None}
        rows = await self._vector_rows(kept, "/vectors")

        def values(current: Any) -> dict[str, Any]:
            value = current.value
            if "value" in given:
                value = merge_patch(current.value, body.value) if body.value is not None else {}
            index = body.index if "index" in given else current.index_fields
            ttl = body.ttl_seconds if "ttl_seconds" in given else (
                None if current.ttl_ms is None else current.ttl_ms / 1000)
            return self._content(value, index, ttl)

        row = await self._resource(namespace, key).patch(pre, values)
        if "vectors" in given:
            dropped: list[tuple[str, str | None]] = []
            for index, fields in vectors_in.items():
                if fields is None:
                    dropped.append((index, None))
                else:
                    dropped.extend((index, field) for field in fields)
            if body.vectors is None:
                await self.repo.delete_vectors(namespace, key)
            else:
                await self.repo.delete_vectors(namespace, key, dropped)
            await self.repo.insert_vectors(namespace, key, rows)
        self._event("updated", namespace, key, row.revision)
        return ItemOut.from_row(row)

    async def remove(self, namespace: str, key: str, pre: Preconditions) -> None:
        revision = await self._resource(namespace, key).delete(pre, TOMBSTONE, self.now)
        await self.repo.delete_vectors(namespace, key)
        self._event("deleted", namespace, key, revision)

    # The single requests: each write under its Idempotency-Key (the tenant's, see
    # `scoped`); a replay answers the first response (status and body) before anything else.

    async def put(self, namespace: str, key: str, body: ItemReplace, pre: Preconditions,
                  idempotency: IdempotencyRequest | None) -> Written:
        async def run() -> tuple[int, dict[str, Any] | None]:
            item, created = await self.replace(namespace, key, body, pre)
            return 201 if created else 200, item.model_dump(mode="json")
        return await self._once("PUT", namespace, key, idempotency, run)

    async def patch(self, namespace: str, key: str, body: ItemPatch, pre: Preconditions,
                    idempotency: IdempotencyRequest | None) -> Written:
        async def run() -> tuple[int, dict[str, Any] | None]:
            return 200, (await self.merge(namespace, key, body, pre)).model_dump(mode="json")
        return await self._once("PATCH", namespace, key, idempotency, run)

    async def delete(self, namespace: str, key: str, pre: Preconditions,
                     idempotency: IdempotencyRequest | None) -> Written:
        async def run() -> tuple[int, dict[str, Any] | None]:
            await self.remove(namespace, key, pre)
            return 204, None
        return await self._once("DELETE", namespace, key, idempotency, run)

    async def _once(self, method: str, namespace: str, key: str,
                    request: IdempotencyRequest | None,
                    run: Callable[[], Awaitable[tuple[int, dict[str, Any] | None]]]) -> Written:
        keys = IdempotencyService(self.uow, ENDPOINT)
        request = scoped(request, method, item_path(namespace, key))
        replay = await keys.begin(None, request)
        if replay is not None:
            return Written(replay.status, replay.body or None, True)
        status, body = await run()
        await keys.save(None, request, status, body or {})
        return Written(status, body, False)

    # --- reads of many ------------------------------------------------------------------

    async def _refresh(self, rows: Sequence[AnyRow]) -> dict[int, Any]:
        """Restart the time to live of the rows that have one: their new `expires_at`."""
        by_ttl: dict[int, list[int]] = defaultdict(list)
        for row in rows:
            if row.ttl_ms is not None:
                by_ttl[row.ttl_ms].append(row.id)
        expires: dict[int, Any] = {}
        for ttl, ids in by_ttl.items():
            at = self._expiry(ttl)
            await self.repo.refresh(ids, ttl, at)
            expires.update(dict.fromkeys(ids, at))
        return expires

    def _prefix(self, labels: Sequence[str], pointer: str) -> str | None:
        return "/".join(self.address.labels(labels, pointer, minimum=0)) or None

    async def search(self, body: SearchIn) -> SearchPage:
        where = self.repo.scope(self._prefix(body.namespace_prefix, "/namespace_prefix"),
                                parse_filter(body.filter))
        wanted = body.offset + body.limit + 1
        ranked: list[tuple[AnyRow, float | None]]
        if body.query is None and body.vector is None:
            rows = await self.repo.recent(where, body.limit + 1, body.offset)
            ranked = [(row, None) for row in rows]
        elif body.vector is None:
            words = query_tokens(body.query or "")
            found = await self.repo.lexical(where, words, wanted) if words else []
            ranked = list(found[body.offset:])
        else:
            ranked = await self._vector_search(body, where, wanted)
        page = ranked[:body.limit + 1]
        has_more = len(page) > body.limit
        page = page[:body.limit]
        expires = await self._refresh([row for row, _ in page]) if body.refresh_ttl else {}
        data = []
        for row, score in page:
            item = SearchItemOut.scored(row, score)
            if row.id in expires:
                item = item.model_copy(update={"expires_at": expires[row.id]})
            data.append(item)
        return SearchPage(data=data, has_more=has_more)

    async def _vector_search(self, body: SearchIn, where: Scope,
                             wanted: int) -> list[tuple[AnyRow, float | None]]:
        assert body.vector is not None
        query = body.vector
        vectors.pack(query.embedding, "/vector/embedding")  # the same number rules
        held = (await self.repo.dims_of([query.index])).get(query.index)
        if held is not None and held != len(query.embedding):
            raise VectorDimsMismatch(
                f"vector: index {query.index!r} holds {held}-dimensional vectors; the query "
                f"has {len(query.embedding)}.", errors=[
                    {"pointer": "/vector/embedding", "code": "vector_dims_mismatch",
                     "message": f"{held} dimensions expected"}])
        n = max(wanted, HYBRID_WINDOW) if body.query is not None else wanted
        ranking = vectors.Ranking()
        if held is not None:
            async for ids, blob in self._candidates(where, query, held, n):
                ranking.add(ids, vectors.scores(blob, query.embedding, query.metric))
        by_vector, best, scored = ranking.best(n)
        if body.query is not None:
            return await self._fused(body, where, wanted, by_vector)
        page_ids = by_vector[body.offset:wanted]
        rows = await self.repo.by_ids(page_ids)
        ranked: list[tuple[AnyRow, float | None]] = [(rows[i], best[i]) for i in page_ids]
        missing = wanted - body.offset - len(ranked)
        if missing > 0:  # then the items with no vector in the index, by recency
            tail = await self.repo.without_vectors(
                where, query.index, missing, max(0, body.offset - scored))
            ranked.extend((row, None) for row in tail)
        return ranked

    async def _candidates(self, where: Scope, query: VectorQuery, dims: int,
                          n: int) -> AsyncIterator[tuple[list[int], bytes]]:
        """The vectors to score: every candidate's, or where Postgres has pgvector only
        those of the nearest n items, found in SQL (app/store/pgvector.py)."""
        await self.repo.ensure_statistics()  # both join items and vectors
        if await self.repo.has_pgvector():
            for chunk in await pgvector.NearestVectors(
                    self.repo, where, query.index, dims, query.metric, query.embedding,
                    self.settings).nearest(n):
                yield chunk
            return
        async for chunk in self.repo.vectors(where, query.index, dims):
            yield chunk

    async def _fused(self, body: SearchIn, where: Scope, wanted: int,
                     by_vector: list[int]) -> list[tuple[AnyRow, float | None]]:
        """Reciprocal rank fusion of the text ranking and the vector ranking."""
        window = max(wanted, HYBRID_WINDOW)
        words = query_tokens(body.query or "")
        by_text = [row.id for row, _ in await self.repo.lexical(where, words, window)] \
            if words else []
        fused: dict[int, float] = defaultdict(float)
        for ranking in (by_text, by_vector[:window]):
            for rank, item_id in enumerate(ranking, start=1):
                fused[item_id] += 1.0 / (RRF_K + rank)
        order = sorted(fused, key=lambda item_id: (-fused[item_id], -item_id))
        page_ids = order[body.offset:wanted]
        rows = await self.repo.by_ids(page_ids)
        return [(rows[i], fused[i]) for i in page_ids]

    async def list_namespaces(self, body: NamespacesIn) -> NamespacePage:
        prefix = body.prefix or []
        suffix = body.suffix or []
        self.address.labels(prefix, "/prefix", minimum=0)
        self.address.labels(suffix, "/suffix", minimum=0)
        fixed = []
        for label in prefix:
            if label == "*":
                break
            fixed.append(label)
        stored = await self.repo.namespaces(self._prefix(fixed, "/prefix"))
        found = set()
        for path in stored:
            labels = tuple(labels_of(path))
            if _matches(labels, prefix) and _matches(labels[::-1], suffix[::-1]):
                found.add(labels[:body.max_depth] if body.max_depth else labels)
        ordered = sorted(found)[body.offset:body.offset + body.limit + 1]
        return NamespacePage(data=[list(ns) for ns in ordered[:body.limit]],
                             has_more=len(ordered) > body.limit)


TOMBSTONE: dict[str, Any] = {"value": {}, "index_fields": None, "search_text": None, "ttl_ms": None,
             "expires_at": None}


def _matches(labels: tuple[str, ...], pattern: Sequence[str]) -> bool:
    """Labels that start with `pattern`, where `*` matches any one label."""
    return len(labels) >= len(pattern) and all(
        want == "*" or want == label for label, want in zip(labels, pattern, strict=False))


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
