"""How a ``dqa regen`` run shows itself: ``view(RegenConfig) -> View`` (one-line events, the live
display, whether it handles SIGINT/SIGTERM). The main-thread check is here, once: signals are
handled only when the config asks for it and the run is on the main thread (``RegenConfig.
install_signal_handlers``: the CLI). The live display itself is ``dqa.reports.regen_live``.
"""

from __future__ import annotations

import os
import sys
import threading

from dqa.regen.config import RegenConfig
from dqa.regen.run_values import View
from dqa.regen.wire.urls import strip_userinfo


def view(c: RegenConfig) -> View:
    """The run's presentation from the config's: ``log`` default prints to stderr (URL
    credentials removed); ``live`` default: when stderr is a terminal; ``signals``: the config's
    ``install_signal_handlers``, on the main thread only (signal handlers can be set nowhere else)."""
    log = c.log or _default_log
    live = c.live if c.live is not None else (sys.stderr.isatty() and os.environ.get("TERM") != "dumb")
    signals = c.install_signal_handlers and threading.current_thread() is threading.main_thread()
    return View(lambda msg: log(strip_userinfo(msg)), live, signals, c.on_progress)


def _default_log(msg: str) -> None:
    print(f"dqa regen: {msg}", file=sys.stderr, flush=True)
