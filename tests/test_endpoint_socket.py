"""The endpoint's connections send each reply at once: Nagle's algorithm is off on them.

uvicorn writes a reply's headers and body in two writes; with Nagle on, the body waits for the
client's delayed ACK (up to 40 ms a call, bench/endpoint_overhead.py).  asyncio turns it off only on
accepted sockets whose protocol says TCP, so the listening socket must be made with IPPROTO_TCP."""

from __future__ import annotations

import asyncio
import socket

from mas.rollout.endpoint import EndpointServer


def test_the_listening_socket_is_tcp_with_nagle_off_and_so_is_a_connection_asyncio_accepts_from_it():
    server = EndpointServer()
    try:
        sock = server._sock
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        sock.listen()
        seen = {}

        async def main():
            async def on_connect(reader, writer):
                seen["nodelay"] = writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                writer.close()

            srv = await asyncio.start_server(on_connect, sock=sock)
            port = sock.getsockname()[1]
            _, w = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(100):
                if "nodelay" in seen:
                    break
                await asyncio.sleep(0.01)
            w.close()
            srv.close()

        asyncio.run(main())
        assert seen["nodelay"] != 0
    finally:
        server._sock.close()
