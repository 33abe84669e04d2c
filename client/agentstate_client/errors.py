"""Errors raised by the agentstate client.

Every problem the server answers (RFC 9457 `application/problem+json`) becomes one exception
class, chosen by the problem's stable `code` (falling back to its HTTP status), built by one
factory: `error_from_response`. Catch as narrowly or as broadly as you need:

    AgentStateError
    ├── APIConnectionError            the request never got an answer (after retries)
    │   └── APITimeoutError
    └── APIError                      the server answered with a problem (status >= 400)
        ├── BadRequest (400)          InvalidJson, InvalidCursor, InvalidHeader
        ├── Unauthorized (401)
        ├── Forbidden (403)
        ├── NotFound (404)            CheckpointNotFound
        ├── NotAcceptable (406)       a stream asked for without Accept: text/event-stream
        ├── Conflict (409)            ThreadExists, MessageExists, IdempotencyInFlight,
        │                             CompactionCovered, MessageCompacted, CheckpointExists,
        │                             CheckpointItemsMissing, MessageAmbiguous,
        │                             MessageReferenced
        ├── Gone (410)                ThreadDeleted
        ├── PreconditionFailed (412)  RevisionMismatch, AlreadyExists  (`current_revision`)
        ├── PayloadTooLarge (413)
        ├── UnsupportedMediaType (415)
        ├── UnprocessableEntity (422) UnknownField, IdempotencyKeyReused,
        │                             CompactionNotContiguous, MessageNotLive, MessageNotFound,
        │                             UnknownSecret, ParentNotFound, StoreValueTooLarge,
        │                             VectorDimsMismatch, TooManyVectors
        ├── PreconditionRequired (428)
        ├── TooManyRequests (429)
        ├── InternalServerError (500) SecretsUndecryptable
        └── ServiceUnavailable (503)  DatabaseUnavailable, NotReady, SecretsNotConfigured

`agentstate_client.aisuite.StateConflictError` (a subclass of aisuite's own
`StateConflictError` when aisuite is installed) is an `AgentStateError` too.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

__all__ = [
    "APIConnectionError", "APIError", "APITimeoutError", "AgentStateError", "AlreadyExists",
    "BadRequest", "CheckpointExists", "CheckpointItemsMissing", "CheckpointNotFound",
    "CompactionCovered", "CompactionNotContiguous", "Conflict",
    "DatabaseUnavailable", "Forbidden", "Gone", "IdempotencyInFlight", "IdempotencyKeyReused",
    "InternalServerError", "InvalidCursor", "InvalidHeader", "InvalidJson", "MessageAmbiguous", "MessageCompacted", "MessageExists",
    "MessageNotFound", "MessageNotLive", "MessageReferenced", "NotAcceptable", "NotFound",
    "NotReady", "ParentNotFound", "PayloadTooLarge",
    "PreconditionFailed", "PreconditionRequired", "RevisionMismatch", "SecretsNotConfigured",
    "SecretsUndecryptable", "ServiceUnavailable", "StoreValueTooLarge", "ThreadDeleted",
    "ThreadExists", "TooManyRequests", "TooManyVectors", "Unauthorized", "UnknownField", "UnknownSecret", "UnprocessableEntity",
    "UnsupportedMediaType", "VectorDimsMismatch", "error_from_response",
]


class AgentStateError(Exception):
    """Base class of every error this package raises."""


class APIConnectionError(AgentStateError):
    """No answer from the server: connection refused or dropped, after the allowed retries."""

    def __init__(self, message: str, *, request: httpx.Request | None = None) -> None:
        super().__init__(message)
        self.request = request


class APITimeoutError(APIConnectionError):
    """The request timed out (after the allowed retries)."""


class APIError(AgentStateError):
    """The server answered with an error status; the fields of its problem details.

    `code` is the stable snake_case code to switch on; `errors` lists the offending members
    (`pointer`/`parameter`, `code`, `message`) of a 422; `problem` is the whole body.
    """

    status: ClassVar[int] = 0
    default_code: ClassVar[str] = "http_error"

    def __init__(self, response: httpx.Response, problem: dict[str, Any]) -> None:
        self.response = response
        self.problem = problem
        self.status_code: int = response.status_code
        self.code: str = str(problem.get("code") or self.default_code)
        self.title: str = str(problem.get("title") or response.reason_phrase)
        self.detail: str = str(problem.get("detail") or self.title)
        self.type: str | None = problem.get("type")
        self.instance: str | None = problem.get("instance")
        self.errors: list[dict[str, Any]] = list(problem.get("errors") or [])
        self.request_id: str | None = response.headers.get("x-request-id")
        super().__init__(f"{self.status_code} {self.code}: {self.detail}")


class BadRequest(APIError):
    status, default_code = 400, "bad_request"


class InvalidJson(BadRequest):
    default_code = "invalid_json"


class InvalidCursor(BadRequest):
    default_code = "invalid_cursor"


class InvalidHeader(BadRequest):
    default_code = "invalid_header"


class Unauthorized(APIError):
    status, default_code = 401, "unauthorized"


class Forbidden(APIError):
    status, default_code = 403, "forbidden"


class NotFound(APIError):
    status, default_code = 404, "not_found"


class CheckpointNotFound(NotFound):
    default_code = "checkpoint_not_found"


class Conflict(APIError):
    status, default_code = 409, "conflict"


class ThreadExists(Conflict):
    default_code = "thread_exists"


class MessageExists(Conflict):
    default_code = "message_exists"


class IdempotencyInFlight(Conflict):
    """The first request with this Idempotency-Key is still being processed; retry later."""

    default_code = "idempotency_in_flight"


class CompactionCovered(Conflict):
    default_code = "compaction_covered"


class MessageCompacted(Conflict):
    """A removal or redaction of a message that a live compaction replaced or wrote."""

    default_code = "message_compacted"


class MessageAmbiguous(Conflict):
    """A message id that several messages of the tenant carry (a forked thread keeps its
    source's ids), used where it must name one: a `parent_id`, `get_lineage`."""

    default_code = "message_ambiguous"


class MessageReferenced(Conflict):
    """A thread delete or message removal refused because messages of other threads (or
    messages kept in this one) continue the messages it would take (their `parent_id`)."""

    default_code = "message_referenced"


class CheckpointExists(Conflict):
    """A checkpoint with the same (namespace, id) and other content exists: they are
    immutable."""

    default_code = "checkpoint_exists"


class CheckpointItemsMissing(Conflict):
    """Items sent by digest that the thread does not hold (`problem["missing"]`)."""

    default_code = "checkpoint_items_missing"


class Gone(APIError):
    status, default_code = 410, "gone"


class ThreadDeleted(Gone):
    """The thread was deleted; only an explicit create starts the id afresh."""

    default_code = "thread_deleted"


class PreconditionFailed(APIError):
    """412. `current_revision` is the resource's revision now (None if it does not exist)."""

    status, default_code = 412, "precondition_failed"

    def __init__(self, response: httpx.Response, problem: dict[str, Any]) -> None:
        super().__init__(response, problem)
        current = problem.get("current_revision")
        self.current_revision: int | None = current if isinstance(current, int) else None


class RevisionMismatch(PreconditionFailed):
    """If-Match named a revision that is not current; nothing was written."""

    default_code = "revision_mismatch"


class AlreadyExists(PreconditionFailed):
    """A create-only write (If-None-Match: *) found the resource already there."""

    default_code = "already_exists"


class PayloadTooLarge(APIError):
    status, default_code = 413, "payload_too_large"


class NotAcceptable(APIError):
    status, default_code = 406, "not_acceptable"


class UnsupportedMediaType(APIError):
    status, default_code = 415, "unsupported_media_type"


class UnprocessableEntity(APIError):
    status, default_code = 422, "validation_failed"


class UnknownField(UnprocessableEntity):
    default_code = "unknown_field"


class IdempotencyKeyReused(UnprocessableEntity):
    default_code = "idempotency_key_reused"


class CompactionNotContiguous(UnprocessableEntity):
    default_code = "compaction_not_contiguous"


class MessageNotLive(UnprocessableEntity):
    default_code = "message_not_live"


class MessageNotFound(UnprocessableEntity):
    default_code = "message_not_found"


class ParentNotFound(UnprocessableEntity):
    """A `parent_id` that names no message of the tenant (nor an earlier one of the
    request)."""

    default_code = "parent_not_found"


class UnknownSecret(UnprocessableEntity):
    """`"***"` asked to keep a stored MCP server secret that does not exist."""

    default_code = "unknown_secret"


class StoreValueTooLarge(UnprocessableEntity):
    """A store item's value is over the server's limit (AGENTSTATE_STORE_MAX_VALUE_BYTES)."""

    default_code = "value_too_large"


class VectorDimsMismatch(UnprocessableEntity):
    """A vector's dimension differs from what its store index holds (a new embedding model
    is a new index name)."""

    default_code = "vector_dims_mismatch"


class TooManyVectors(UnprocessableEntity):
    """A store item was given more vectors than the server allows."""

    default_code = "too_many_vectors"


class PreconditionRequired(APIError):
    """428: a write to an existing resource must send If-Match (or If-None-Match: *)."""

    status, default_code = 428, "precondition_required"


class TooManyRequests(APIError):
    status, default_code = 429, "too_many_requests"


class InternalServerError(APIError):
    status, default_code = 500, "internal_error"



class SecretsUndecryptable(InternalServerError):
    """Stored secrets were encrypted with a key the server no longer has; masked reads still
    work."""

    default_code = "secrets_undecryptable"


class ServiceUnavailable(APIError):
    status, default_code = 503, "service_unavailable"


class DatabaseUnavailable(ServiceUnavailable):
    default_code = "database_unavailable"


class NotReady(ServiceUnavailable):
    default_code = "not_ready"


class SecretsNotConfigured(ServiceUnavailable):
    """The server has no AGENTSTATE_SECRET_KEYS, so it cannot store MCP secrets; an operator's
    fix (503 since server 0.2; 500 before). Writes without secrets still work."""

    default_code = "secrets_not_configured"


def _leaves(cls: type[APIError]) -> list[type[APIError]]:
    return [cls, *(leaf for sub in cls.__subclasses__() for leaf in _leaves(sub))]


_BY_STATUS: dict[int, type[APIError]] = {c.status: c for c in APIError.__subclasses__()}
_BY_CODE: dict[str, type[APIError]] = {c.default_code: c for c in _leaves(APIError)}


def error_from_response(response: httpx.Response) -> APIError:
    """The exception for an error response: by problem `code`, else by status.

    Bodies that are not problem details (a proxy's HTML page) still give an `APIError` of
    the status' class, with the response text as `detail`.
    """
    try:
        body = response.json()
    except ValueError:
        body = None
    problem: dict[str, Any] = body if isinstance(body, dict) else {
        "detail": response.text[:500] or response.reason_phrase
    }
    cls = _BY_CODE.get(str(problem.get("code")))
    if cls is None or cls.status != response.status_code:
        cls = _BY_STATUS.get(response.status_code, APIError)
    return cls(response, problem)
