"""Errors a request can meet, each carrying its HTTP status and OpenAI-style code (Zulip's pattern):
the API turns any of them into an error object, the chat into an error message on the socket."""

from __future__ import annotations


class ServiceError(Exception):
    """A request that cannot be served; `param` names the field at fault."""

    status = 400
    code = "invalid_value"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


class InvalidValue(ServiceError):
    pass


class InvalidType(InvalidValue):
    code = "invalid_type"


class MissingParameter(InvalidValue):
    code = "missing_required_parameter"


class InvalidJson(InvalidValue):
    code = "invalid_json"


class UnsupportedValue(InvalidValue):
    code = "unsupported_value"


class EmptyPrompt(InvalidValue):
    code = "empty_prompt"


class ContextLengthExceeded(InvalidValue):
    code = "context_length_exceeded"


class InvalidKey(ServiceError):
    status = 401
    code = "invalid_api_key"


class Forbidden(ServiceError):
    status = 403
    code = "forbidden"


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(ServiceError):
    status = 405
    code = "method_not_allowed"


class RequestTooLarge(ServiceError):
    status = 413
    code = "request_too_large"


class ConcurrencyLimit(ServiceError):
    status = 429
    code = "concurrency_limit_exceeded"


class AnswerInProgress(ServiceError):
    """A conversation writes one answer at a time."""

    status = 409
    code = "answer_in_progress"


class InternalError(ServiceError):
    status = 500
    code = "internal_error"


class ModelUnavailable(ServiceError):
    status = 503
    code = "model_unavailable"


class DatabaseUnavailable(ServiceError):
    status = 503
    code = "database_unavailable"


DATABASE_DOWN = "The database did not answer (it may be restarting); try again in a few seconds."


class GenerationFailed(ServiceError):
    status = 503
    code = "generation_failed"


class Unhealthy(ServiceError):
    status = 503
    code = "unhealthy"


class AccessRevoked(InvalidKey):
    """The key was revoked, or its user deactivated, while a stream was open."""

    code = "access_revoked"
