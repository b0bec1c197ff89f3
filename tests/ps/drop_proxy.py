"""A TCP proxy in front of a PS node that loses the reply of a call: the connection dies.

Armed with ``drop_replies(n)``, the proxy cuts the next ``n`` connections the
moment the node starts answering a call on them (the first HTTP/2 HEADERS frame
of a stream, from the node): the node has applied the request, the client sees
the connection lost (UNAVAILABLE) and cannot tell whether it was. Every other
byte passes unchanged, so a resend over a fresh connection gets through.
"""

from __future__ import annotations

import contextlib
import socket
import threading

_FRAME_HEAD = 9  # HTTP/2: length (3), type (1), flags (1), stream id (4)
_HEADERS = 0x1


class DropProxy:
    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._cond = threading.Condition()
        self._to_drop = 0
        self.dropped = 0
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def drop_replies(self, count: int = 1) -> None:
        with self._cond:
            self._to_drop += count

    def wait_dropped(self, count: int, timeout: float = 60.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.dropped >= count, timeout)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            with self._cond:
                self._sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        _shut(sink)

    def _replies(self, server: socket.socket, client: socket.socket) -> None:
        """Node to client, frame by frame; cut at a reply's HEADERS while armed."""
        buffer = b""
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                buffer += data
                out = b""
                while len(buffer) >= _FRAME_HEAD:
                    length = int.from_bytes(buffer[:3], "big")
                    if len(buffer) < _FRAME_HEAD + length:
                        break
                    kind = buffer[3]
                    stream = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
                    if kind == _HEADERS and stream and self._take_drop():
                        client.sendall(out)
                        _shut(client)
                        _shut(server)
                        with self._cond:
                            self.dropped += 1
                            self._cond.notify_all()
                        return
                    out += buffer[: _FRAME_HEAD + length]
                    buffer = buffer[_FRAME_HEAD + length :]
                client.sendall(out)
        _shut(client)

    def _take_drop(self) -> bool:
        with self._cond:
            if self._to_drop <= 0:
                return False
            self._to_drop -= 1
            return True

    def close(self) -> None:
        self._listener.close()
        with self._cond:
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
