"""The answer ids the routes take."""

import uuid


class AnswerIdConverter:
    """An answer's id as the API returned it (`cmpl-<uuid>`, `chatcmpl-<uuid>`) or bare: scripts pass on
    the id they were given."""

    regex = r"(?:chatcmpl-|cmpl-)?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"

    def to_python(self, value: str) -> uuid.UUID:
        return uuid.UUID(value.removeprefix("chat").removeprefix("cmpl-"))

    def to_url(self, value: uuid.UUID) -> str:
        return str(value)
