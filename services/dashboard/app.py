"""The curses loop: poll the engine every 500 ms, redraw, handle keys.

Signals keep their meaning (cbreak mode, not raw): under `helios run`, Ctrl-C reaches the
launcher, which sets the stop event and shuts the services down; standalone, Ctrl-C or `q`
exits 0.
"""

from __future__ import annotations

import contextlib
import curses
import os
import sys
import threading
import time

import grpc

from services.dashboard.render import PANES, View, screen
from services.dashboard.sample import EngineSource
from services.dashboard.state import DashboardState

POLL_INTERVAL_S = 0.5


class Dashboard:
    def __init__(self, source: EngineSource, stop: threading.Event | None = None) -> None:
        self.source = source
        self.state = DashboardState()
        self.view = View()
        self.stop = stop or threading.Event()
        self.model = source.model_name()

    def poll(self) -> None:
        try:
            self.state.ingest(self.source.poll(), time.monotonic())
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "error"
            self.state.ingest_error(f"engine unreachable ({code}) at {self.source.address}")

    def handle_key(self, key: int) -> bool:
        """Apply one key; False means quit."""
        if key in (ord("q"), ord("Q")):
            return False
        if key in (ord("\t"), curses.KEY_RIGHT, curses.KEY_LEFT, curses.KEY_BTAB):
            step = -1 if key in (curses.KEY_LEFT, curses.KEY_BTAB) else 1
            index = (PANES.index(self.view.pane) + step) % len(PANES)
            self.view = View(PANES[index], self.view.scroll)
        elif key == curses.KEY_DOWN:
            self.view = View(self.view.pane, self.view.scroll + 1)
        elif key == curses.KEY_UP:
            self.view = View(self.view.pane, max(0, self.view.scroll - 1))
        return True

    def _draw(self, window: curses.window) -> None:
        # A resize that happened before curses started sends no KEY_RESIZE: ask the terminal.
        with contextlib.suppress(OSError):
            size = os.get_terminal_size(sys.__stdout__.fileno())  # type: ignore[union-attr]
            if (size.lines, size.columns) != window.getmaxyx():
                curses.resizeterm(size.lines, size.columns)
        height, width = window.getmaxyx()
        lines = screen(self.state, self.model, time.monotonic(), width - 1, height, self.view)
        rows = len(self.state.rows)
        self.view = View(self.view.pane, min(self.view.scroll, max(0, rows - 1)))
        window.erase()
        for y, line in enumerate(lines):
            with contextlib.suppress(curses.error):  # the screen's last cell is unwritable
                window.addstr(y, 0, line)
        window.refresh()

    def _loop(self, window: curses.window) -> None:
        curses.curs_set(0)
        window.timeout(100)
        window.keypad(True)
        next_poll = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_poll:
                self.poll()
                next_poll = now + POLL_INTERVAL_S
                self._draw(window)
            key = window.getch()
            if key == -1:
                continue
            if key == curses.KEY_RESIZE or self.handle_key(key):
                self._draw(window)
            else:
                break

    def run(self) -> int:
        try:
            curses.wrapper(self._loop)
        except KeyboardInterrupt:
            pass
        finally:
            self.source.close()
        return 0
