"""Closed-loop clients on threads, for blocking clients (tritonclient's synchronous ones, raw
sockets): each thread runs `once()` again when the last call ended, after a pause, until stopped."""
import random
import threading
import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


class LoopThread(threading.Thread):
    """One client: calls `once()` until `stop` is set, waiting `pause` seconds (+-50% when
    `jitter`) between calls. An exception `once()` lets out goes to `on_error` and the loop goes
    on: a bug of the harness or a dead server is counted there, never silent."""

    def __init__(self, name: str, stop: threading.Event, pause: float = 0.0, seed: int = 0, jitter: bool = True,
                 on_error: Callable[["LoopThread", BaseException], None] = None):
        super().__init__(name=name, daemon=True)
        self.stop_event, self.pause, self.jitter = stop, pause, jitter
        self.rng = random.Random(seed)
        self.on_error = on_error

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.once()
            except Exception as error:
                if self.on_error is None:
                    raise
                self.on_error(self, error)
            self.stop_event.wait(self.pause * (self.rng.uniform(0.5, 1.5) if self.jitter else 1.0))
        self.close()

    def once(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class CallLoop(LoopThread):
    """A LoopThread around a plain function."""

    def __init__(self, call: Callable[[], None], name: str, stop: threading.Event, **kwargs):
        super().__init__(name, stop, **kwargs)
        self.call = call

    def once(self) -> None:
        self.call()


def poll(condition: Callable[[], Optional[T]], timeout: float, every: float = 0.1) -> Optional[T]:
    """The first true value of `condition()`, tried every `every` seconds; None after `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() >= deadline:
            return None
        time.sleep(every)
    return value
