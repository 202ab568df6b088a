"""A bare-bones HTTP/1.1 SSE client on asyncio streams, for holding very many streams at once from one
process (a full HTTP client's connection pool costs more than the streams it holds)."""

from __future__ import annotations

import asyncio
import json


class RawStream:
    """One POST with a JSON body whose chunked SSE response is read line by line."""

    def __init__(self, host: str, port: int, path: str, body: dict):
        self.host, self.port, self.path = host, port, path
        self.body = json.dumps(body).encode()
        self.status: int | None = None
        self.pings = 0
        self.pinged = asyncio.Event()
        self.data: list[str] = []
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self._reader = reader
        self._writer.write(f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                           f"Content-Type: application/json\r\nContent-Length: {len(self.body)}\r\n\r\n".encode()
                           + self.body)
        await self._writer.drain()
        status_line = await reader.readline()
        self.status = int(status_line.split()[1])
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # headers: the body is chunked (it is a stream)

    async def read_to_end(self) -> None:
        """Read chunks until the terminating zero-size chunk; collect `data:` lines and count pings."""
        pending = b""
        while True:
            size = int((await self._reader.readline()).strip() or b"0", 16)
            if size == 0:
                return
            pending += await self._reader.readexactly(size)
            await self._reader.readexactly(2)  # CRLF after each chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                text = line.decode().rstrip("\r")
                if text.startswith(":"):
                    self.pings += 1
                    self.pinged.set()
                elif text.startswith("data: "):
                    self.data.append(text[6:])

    def outcome(self) -> str:
        if not self.data or self.data[-1] != "[DONE]":
            return "ended without [DONE]"
        if any("error" in json.loads(d) for d in self.data[:-1]):
            return "error event"
        return "done"

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
