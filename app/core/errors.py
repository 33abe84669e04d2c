"""One error hierarchy, rendered by one handler as RFC 9457 problem details.

Services raise `AppError` subclasses; they never build HTTP responses. Each class carries its
status and a stable snake_case `code` that clients (and `agentstate_client`) switch on. This
module holds the generic classes; an error that belongs to one slice lives in that slice's
`errors.py` (`app/threads/errors.py`, ...). `app/http/problems.py` renders them all.
"""

from __future__ import annotations

from typing import Any

PROBLEM_TYPE_PREFIX = "urn:agentstate:problem:"


class AppError(Exception):
    # Class attributes, so a subclass names its status once; an instance may override them
    # (a framework status with no class of its own, see `problem_from_status`).
    status: int = 500
    code: str = "internal_error"
    title: str = "Internal Server Error"

    def __init__(self, detail: str | None = None, *, headers: dict[str, str] | None = None,
                 **extra: Any) -> None:
        self.detail = detail or self.title
        self.headers = headers or {}
        self.extra = extra
        super().__init__(self.detail)

    def body(self, instance: str) -> dict[str, Any]:
        return {
            "type": PROBLEM_TYPE_PREFIX + self.code,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "instance": instance,
            "code": self.code,
            **self.extra,
        }


class BadRequest(AppError):
    status, code, title = 400, "bad_request", "Bad Request"


class InvalidJson(BadRequest):
    code, title = "invalid_json", "Body is not valid JSON"


class InvalidCursor(BadRequest):
    code, title = "invalid_cursor", "Invalid cursor"


class InvalidHeader(BadRequest):
    code, title = "invalid_header", "Invalid header"


class Unauthorized(AppError):
    status, code, title = 401, "unauthorized", "Unauthorized"

    def __init__(self, detail: str | None = None, **extra: Any) -> None:
        super().__init__(detail, headers={"WWW-Authenticate": 'Bearer realm="agentstate"'}, **extra)


class Forbidden(AppError):
    status, code, title = 403, "forbidden", "Forbidden"


class NotFound(AppError):
    status, code, title = 404, "not_found", "Not Found"


class Conflict(AppError):
    status, code, title = 409, "conflict", "Conflict"


class Gone(AppError):
    status, code, title = 410, "gone", "Gone"


class PreconditionFailed(AppError):
    status, code, title = 412, "precondition_failed", "Precondition Failed"


class RevisionMismatch(PreconditionFailed):
    code, title = "revision_mismatch", "Revision mismatch"

    def __init__(self, current_revision: int | None, detail: str | None = None) -> None:
        super().__init__(
            detail or "If-Match does not name the current revision; nothing was written.",
            current_revision=current_revision,
        )


class AlreadyExists(PreconditionFailed):
    code, title = "already_exists", "Resource already exists"

    def __init__(self, current_revision: int | None, detail: str | None = None) -> None:
        super().__init__(
            detail or "If-None-Match: * was sent and the resource exists; nothing was written.",
            current_revision=current_revision,
        )


class NotAcceptable(AppError):
    status, code, title = 406, "not_acceptable", "Not Acceptable"


class PayloadTooLarge(AppError):
    status, code, title = 413, "payload_too_large", "Payload Too Large"


class UnsupportedMediaType(AppError):
    status, code, title = 415, "unsupported_media_type", "Unsupported Media Type"


class Unprocessable(AppError):
    status, code, title = 422, "validation_failed", "Unprocessable Content"


class PreconditionRequired(AppError):
    status, code, title = 428, "precondition_required", "Precondition Required"


class SecretsNotConfigured(AppError):
    """The server has no key to encrypt secrets with: an operator's fix, not the client's, so
    503 (this server cannot do it now), not a 4xx the client would take as its own fault."""

    status, code, title = 503, "secrets_not_configured", "Secrets are not configured"


class SecretsUndecryptable(AppError):
    """Stored secrets were written with a key that is no longer configured."""

    status, code, title = 500, "secrets_undecryptable", "Secrets cannot be decrypted"


class ServiceUnavailable(AppError):
    status, code, title = 503, "database_unavailable", "Service Unavailable"


class NotReady(ServiceUnavailable):
    code, title = "not_ready", "Service not ready"


def problem_from_status(status: int, detail: str | None = None, *,
                        headers: dict[str, str] | None = None) -> AppError:
    """Map an HTTP-level status (404 route, 405 method, 414 URI) to our hierarchy."""
    cls: type[AppError] | None = {
        400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
        406: NotAcceptable, 409: Conflict, 410: Gone, 412: PreconditionFailed, 413: PayloadTooLarge,
        415: UnsupportedMediaType, 422: Unprocessable, 428: PreconditionRequired,
        503: ServiceUnavailable,
    }.get(status)
    if cls is not None:
        return cls(detail, headers=headers) if cls is not Unauthorized else cls(detail)
    error = AppError(detail, headers=headers)
    error.status = status
    error.code, error.title = {
        405: ("method_not_allowed", "Method Not Allowed"),
        406: ("not_acceptable", "Not Acceptable"),
        414: ("uri_too_long", "URI Too Long"),
    }.get(status, ("http_error", detail or "HTTP error"))
    return error
