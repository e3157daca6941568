"""Work in a spawned process beside this one: an evaluation beside RaC's rollouts, the control's
fine-tune beside RaC's. On a 2-core CPU, two one-thread jobs side by side do more in a minute
than one job on both threads (docs/results.md, "RaC with a camera policy").

Spawned, not forked: a forked child would inherit torch's thread pools and an EGL context. The
child exits when this process dies, so a killed run leaves nothing running on; an error in the
child is raised here by `result()`.
"""

from __future__ import annotations

from typing import Any, Callable


class Beside:
    """`fn(*args)` in one spawned process. `fn` and `args` must pickle: a module-level function
    and plain values (paths as strings, dataclasses of plain fields)."""

    def __init__(self, fn: Callable[..., Any], *args: Any):
        import multiprocessing
        import os
        from concurrent.futures import ProcessPoolExecutor

        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_exit_with_parent, initargs=(os.getpid(),))
        self._future = self._pool.submit(fn, *args)

    def result(self) -> Any:
        """Wait for `fn`'s return value (its exception, re-raised here)."""
        try:
            return self._future.result()
        finally:
            self._pool.shutdown()

    def cancel(self) -> None:
        """Kill the child now (this process goes on)."""
        for p in list(getattr(self._pool, "_processes", {}).values()):
            p.kill()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _exit_with_parent(parent: int) -> None:
    import os
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
