"""The log daemon and its clients: `streamlog serve` and `streamlog://HOST:PORT` URLs.

    codes       MessageType and ErrorCode numbers, the wire's exceptions, the error map
    columns     records on the wire: APPEND / BATCH payloads as the log's columns
    messages    frame layout, field kinds, message classes, encode / decode
    operations  the table of request/reply operations: requests, replies, both ends
    connection  the sans-I/O connection: bytes <-> messages, and the protocol's rules
    session     the daemon's side of one connection: requests, appends, reads
    server      LogServer (listening, metrics, HTTP, drain) and ServerConfig
    link        the client's connections (a private I/O thread, or the caller's loop)
    client      RemoteLog: the streamlog.Log API over a daemon; open_remote(url)
    serve_cli   `streamlog serve` argument parsing and start-up

A module imports only modules above it in this list (session names LogServer for type
checkers only). codes, columns, messages, operations and connection do no I/O.
"""

from .codes import (AuthenticationFailed, DaemonError, DaemonUnavailable, ErrorCode,
                    LocalProtocolError, ProtocolError, RemoteError, RemoteProtocolError)

__all__ = ["open_remote", "RemoteLog", "ErrorCode", "ProtocolError", "LocalProtocolError",
           "RemoteProtocolError", "DaemonError", "DaemonUnavailable", "AuthenticationFailed",
           "RemoteError"]


def __getattr__(name):  # the client pulls in threads and asyncio only when used
    if name in ("open_remote", "RemoteLog"):
        from . import client
        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
