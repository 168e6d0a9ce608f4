"""Blocking lab calls as coroutines a notebook can `await` and interrupt.

asyncio.to_thread() would do, but for the notebook's Interrupt: SIGINT may be
delivered to any thread of the kernel's process, and then the main thread only
sees it when its event loop next wakes, which a loop waiting for one thread's
result does not do until that thread is finished (seconds of traffic later).
So the coroutine wakes every tenth of a second, and when it is interrupted or
cancelled it sets `stop`, which the blocking call checks, and leaves.
"""

import asyncio
import threading

POLL = 0.1


async def in_thread(fn, *args, stop: threading.Event, **kwargs):
    """fn(*args, **kwargs) in a thread of its own; its result or its exception."""
    box = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the awaiting coroutine
            box["error"] = e

    t = threading.Thread(target=run, name=f"lab-{getattr(fn, '__name__', 'call')}", daemon=True)
    t.start()
    try:
        while t.is_alive():
            await asyncio.sleep(POLL)
    except BaseException:  # interrupted or cancelled: the call ends too
        stop.set()
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]
