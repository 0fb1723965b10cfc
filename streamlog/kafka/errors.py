"""Kafka's wire error codes, and the errors of the Kafka codec.

The codes are kio's `ErrorCode` (generated from Kafka's own list, so its names and
numbers are Kafka's): re-exported here so that the rest of the package names one place.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "KafkaProtocolError", "FrameTooLarge", "UnsupportedRequest"]


class KafkaProtocolError(ValueError):
    """The peer sent bytes that are not a Kafka request we can parse: the connection
    ends (with this message logged); there is no response to send."""


class FrameTooLarge(KafkaProtocolError):
    """A size field above the listener's bound (or negative): refused before its body
    is buffered."""


class UnsupportedRequest(KafkaProtocolError):
    """A well-framed request with an API key or version this broker does not serve.
    `response` is the encoded error response when Kafka's schema lets us build one
    (UNSUPPORTED_VERSION), else None (the connection ends, the reason logged)."""

    def __init__(self, message: str, api_key: int, api_version: int,
                 correlation_id: int, response: bytes | None) -> None:
        super().__init__(message)
        self.api_key, self.api_version = api_key, api_version
        self.correlation_id, self.response = correlation_id, response
