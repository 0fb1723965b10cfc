"""A TCP proxy on loopback that can make the service behind it go away.

`TcpProxy(("127.0.0.1", port)).start()` forwards every connection to the target;
`down()` cuts every open connection and refuses new ones (the client sees resets and
refused connections, as when a store or the network between goes away); `up()` lets
them through again. Threads, no event loop: the test's writers keep theirs."""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._down = False
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.refused = 0  # connections refused while down

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "TcpProxy":
        threading.Thread(target=self._accept, daemon=True, name="tcp-proxy").start()
        return self

    def down(self) -> None:
        with self._lock:
            self._down = True
            sockets, self._open = self._open, set()
        for sock in sockets:
            _close(sock)

    def up(self) -> None:
        with self._lock:
            self._down = False

    def close(self) -> None:
        self._closed = True
        self.down()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                down = self._down
            if down:
                self.refused += 1
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                _close(client)  # a reset, as a host that went away
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    try:  # shutdown wakes a thread blocked in recv on it; close alone does not
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
