"""Hold an interrupt while the kernel and our bookkeeping change together.

Ctrl-C in a script and Interrupt in a notebook raise KeyboardInterrupt in the
main thread between any two bytecodes. Arriving between "the kernel attached a
filter" and "the object recorded it", it would leave a filter the object does
not know about: never detached, copying twice after a retry. Inside `held()`
SIGINT is only noted; it is delivered, to whatever handler was there, when the
block ends. Elsewhere than the main thread no signal arrives, so nothing is done.
"""

import signal
import threading
from contextlib import contextmanager


@contextmanager
def held():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got = []
    try:
        old = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    except ValueError:  # an interpreter that does not let us (embedded, shutting down)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if got:
            signal.raise_signal(signal.SIGINT)  # to the handler that was there: KeyboardInterrupt by default
