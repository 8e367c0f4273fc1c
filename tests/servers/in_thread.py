"""A raw asyncio socket server on a free loopback port, run on its own event loop in a thread of
the test process: the base of the tests' scripted peers (hostile generation servers, a
forwarding proxy), which write exactly the bytes a test needs."""

from __future__ import annotations

import asyncio
import threading


class InThreadServer:
    """Subclasses define ``async _serve(reader, writer)`` (one connection). ``start()`` listens and
    sets ``url`` (``http://127.0.0.1:PORT``); ``stop()`` closes the server, cancels every
    connection still being served and ends the thread."""

    def __init__(self):
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def start(self):
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop).result(10)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    def stop(self) -> None:
        async def close():
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
