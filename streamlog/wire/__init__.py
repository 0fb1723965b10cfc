"""The log daemon and its clients: `streamlog serve` and `streamlog://HOST:PORT` URLs.

    protocol   sans-I/O wire protocol: frames <-> messages, ErrorCode, protocol errors
    server     the asyncio daemon (auth, back-pressure, metrics, graceful drain)
    client     RemoteLog: the streamlog.Log API over a connection; open_remote(url)
    serve_cli  `streamlog serve` argument parsing and start-up
"""

from .protocol import (AuthenticationFailed, DaemonError, DaemonUnavailable, ErrorCode,
                       LocalProtocolError, ProtocolError, RemoteError, RemoteProtocolError)

__all__ = ["open_remote", "RemoteLog", "ErrorCode", "ProtocolError", "LocalProtocolError",
           "RemoteProtocolError", "DaemonError", "DaemonUnavailable", "AuthenticationFailed",
           "RemoteError"]


def __getattr__(name):  # the client pulls in threads and asyncio only when used
    if name in ("open_remote", "RemoteLog"):
        from . import client
        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
