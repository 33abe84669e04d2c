"""Bodies of the store (API.md section 7b)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, Field, StrictBool

from app.core.schemas import JsonObject, RowModel, Strict, Timestamp
from app.store.addressing import decode_segment, labels_of

MAX_TTL_SECONDS = 10 * 365 * 86400

# Numbers are strict: `true` is not 1, and "1.5" is not a number.
Number = Annotated[float, Field(strict=True)]
Count = Annotated[int, Field(strict=True)]
TtlSeconds = Annotated[float, Field(
    strict=True, ge=0.001, le=MAX_TTL_SECONDS,
    description="Seconds the item lives after its last write (or read with `refresh_ttl`); "
                "null or omitted: no expiry. Fractions allowed (to the millisecond).",
)]
FieldList = Annotated[list[Annotated[str, Field(min_length=1, max_length=1024)]],
                      Field(max_length=64)]
def _not_a_number(value: Any) -> Any:
    """`false` only as a boolean: a lax Literal[False] would take 0."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError("false, or a list of field paths")
    return value


IndexFields = Annotated[FieldList | Literal[False], BeforeValidator(_not_a_number),
                        Field(description=(
    'The JSON paths lexical search reads: `"text"`, `"meta.title"`, `"chunks[*].body"`, '
    '`"tags[0]"`, `"$"` for the whole value; `false` (or `[]`): not searchable by text. '
    "Omitted or null: the whole value."))]
# {index name: {field: embedding}}: caller-computed vectors, one per field of the item.
Vectors = dict[str, dict[str, list[Number]]]
Label = Annotated[str, Field(min_length=1, description="A namespace label: any non-empty string.")]

_VECTORS = ("Caller-computed embeddings, `{index_name: {field: [numbers]}}`: any number of "
            "named indexes of different dimensions side by side (an index name holds one "
            "dimension in a tenant). A PUT replaces the item's vectors (omitted: none).")


class ItemReplace(Strict):
    value: JsonObject
    ttl_seconds: TtlSeconds | None = None
    index: IndexFields | None = None
    vectors: Vectors | None = Field(None, description=_VECTORS)


class ItemPatch(Strict):
    """RFC 7396 merge-patch of the representation: `value` is merged, `ttl_seconds` and
    `index` replaced (null: none, the whole value), `vectors` merged per index and field
    (`{"vectors": {"old-model": null}}` drops an index's vectors of the item)."""

    value: JsonObject | None = None
    ttl_seconds: TtlSeconds | None = None
    index: IndexFields | None = None
    vectors: dict[str, dict[str, list[Number] | None] | None] | None = None


class ItemOut(RowModel):
    namespace: list[str]
    key: str
    value: JsonObject
    revision: int
    created_at: Timestamp
    updated_at: Timestamp
    expires_at: Timestamp | None = Field(
        None, description="When the item stops being readable (it has a `ttl_seconds`).")
    ttl_seconds: float | None = None
    index: list[str] | Literal[False] | None = Field(
        None, description="The fields lexical search reads (null: the whole value).")

    @classmethod
    def from_row(cls, row: Any) -> Self:
        return cls.model_validate(item_fields(row))


class SearchItemOut(ItemOut):
    score: float | None = Field(description=(
        "Relevance with a `query` or `vector` (higher is better): the text rank, the vector "
        "similarity (cosine, inner product, or minus the L2 distance), or the reciprocal rank "
        "fusion of both; null without either, or for an item with no vector in the index."))

    @classmethod
    def scored(cls, row: Any, score: float | None) -> Self:
        return cls.model_validate({**item_fields(row), "score": score})


Metric = Literal["cosine", "inner_product", "l2"]


class VectorQuery(Strict):
    index: Annotated[str, Field(min_length=1, max_length=255)] = Field(
        description="The vector index to search (the name items were written with).")
    embedding: list[Number] = Field(min_length=1)
    metric: Metric = "cosine"


class SearchIn(Strict):
    namespace_prefix: list[Label] = Field(
        default_factory=list, max_length=10,
        description="Items whose namespace starts with these labels; [] searches the tenant.")
    filter: JsonObject | None = Field(None, description=(
        'Conditions on the value: `{"kind": "note"}` (equality), nested objects for nested '
        'keys (`{"profile": {"age": {"$gte": 18}}}`), operators `$eq $ne $gt $gte $lt $lte`. '
        "Comparisons follow JSON types: numbers numerically, strings as text (code point "
        "order); an order operator never matches a value of another type."))
    query: Annotated[str, Field(max_length=4096)] | None = Field(
        None, description="Lexical relevance: full-text search over the items' index fields.")
    vector: VectorQuery | None = Field(
        None, description="Vector relevance; with `query` too, the two rankings are fused "
                          "(reciprocal rank fusion).")
    limit: Annotated[Count, Field(ge=1, le=1000)] = 10
    offset: Annotated[Count, Field(ge=0, le=100_000)] = 0
    refresh_ttl: StrictBool = Field(
        False, description="Restart the time to live of the items returned.")


class SearchPage(BaseModel):
    data: list[SearchItemOut]
    has_more: bool = Field(description="More results follow at `offset + limit`.")


class NamespacesIn(Strict):
    prefix: list[Label] | None = Field(
        None, max_length=10, description='Namespaces that start with these labels; `"*"` '
                                         "matches any one label.")
    suffix: list[Label] | None = Field(
        None, max_length=10, description='Namespaces that end with these labels; `"*"` '
                                         "matches any one label.")
    max_depth: Annotated[Count, Field(ge=1, le=10)] | None = Field(
        None, description="Namespaces cut to this many labels (and deduplicated).")
    limit: Annotated[Count, Field(ge=1, le=1000)] = 100
    offset: Annotated[Count, Field(ge=0, le=100_000)] = 0


class NamespacePage(BaseModel):
    data: list[list[str]] = Field(description="Namespaces in label order.")
    has_more: bool


def item_fields(row: Any) -> dict[str, Any]:
    """An item row as the representation: namespace and key decoded back to labels."""
    return {
        "namespace": labels_of(row.namespace), "key": decode_segment(row.key),
        "value": row.value, "revision": row.revision, "created_at": row.created_at,
        "updated_at": row.updated_at, "expires_at": row.expires_at,
        "ttl_seconds": None if row.ttl_ms is None else row.ttl_ms / 1000,
        "index": False if row.index_fields == [] else row.index_fields,
    }


# --- The LangGraph SDK's bodies (`langgraph_router.py`, API.md section 7b) ------------------

# A label the SDK can name: its GET joins the labels with ".", so none holds one.
DotlessLabel = Annotated[str, Field(min_length=1, pattern=r"^[^.]+$", description=(
    "A namespace label: a non-empty string without a period."))]
TtlMinutes = Annotated[float, Field(
    strict=True, gt=0, le=MAX_TTL_SECONDS / 60,
    description="Minutes the item lives after its last write (LangGraph counts minutes).")]


class LangGraphPut(Strict):
    namespace: list[DotlessLabel]
    key: Annotated[str, Field(min_length=1)]
    value: JsonObject
    index: IndexFields | None = None
    ttl: TtlMinutes | None = None


class LangGraphDelete(Strict):
    namespace: list[DotlessLabel]
    key: Annotated[str, Field(min_length=1)]


class LangGraphItem(BaseModel):
    """An item as LangGraph's `Item.dict()` has it."""

    namespace: list[str]
    key: str
    value: JsonObject
    created_at: Timestamp
    updated_at: Timestamp

    @classmethod
    def of(cls, item: ItemOut) -> Self:
        return cls.model_validate(item.model_dump(include=set(cls.model_fields)))


class LangGraphSearchItem(LangGraphItem):
    score: float | None = None


class LangGraphSearchPage(BaseModel):
    items: list[LangGraphSearchItem]


class LangGraphNamespaces(BaseModel):
    namespaces: list[list[str]]
