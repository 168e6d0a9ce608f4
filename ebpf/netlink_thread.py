"""The lab's one netlink thread: every pyroute2 call runs on it.

pyroute2 0.9's synchronous classes (IPRoute, Conntrack) are a façade over its
asyncio classes: each call runs `loop.run_until_complete()` on an event loop of
the calling thread's own. A thread that already runs a loop cannot do that: a
Jupyter kernel's main thread (where a notebook cell runs), IPython with its
autoawait, any `asyncio.run()` program. There the call fails with "This event
loop is already running" (pyroute2's maintainers say the same in
svinota/pyroute2#1342: run the synchronous API in a thread of its own, or use the
async classes).

So the lab never calls pyroute2 from the caller's thread. `Netlink` wraps a
pyroute2 object built and used only on one long-lived daemon thread, whose loop
is its own and never runs while idle; a call from any thread (a cell, a script,
several threads at once, a coroutine) is handed to it and its result handed
back. pyroute2's objects are bound to the thread that made them (their loop and
transport are thread-local), so one thread for all of them is also what keeps an
object usable from whichever thread the user calls it.

What stays in the caller's thread: opening the socket. setns() moves only the
calling thread, and a socket keeps the namespace it was made in, so ebpf.netdev
opens the socket where the caller is (in a namespace it has entered, or its own)
and the netlink thread only wraps it.

An interrupt (Ctrl-C, a notebook's Interrupt) while a call is in flight is held
until the call returns and raised then: the kernel has done what was asked, and
the caller's own cleanup sees it done, never a filter it does not know about.
"""

import inspect
import queue
import threading

_ITERATORS = (list, tuple, dict, set, frozenset, str, bytes)


class _Thread:
    """One daemon thread running submitted calls in order."""

    def __init__(self):
        self._lock = threading.Lock()
        self._thread = None
        self._jobs = queue.SimpleQueue()

    def _run(self):
        while True:
            job = self._jobs.get()
            job()

    def _started(self):
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="vtap-lab-netlink", daemon=True)
                self._thread.start()
            return self._thread

    def call(self, fn, *args, undo=None, **kwargs):
        """fn(*args, **kwargs) on the thread. When an interrupt came while it
        ran and it succeeded, undo(result) runs there too before the interrupt
        is raised: what the caller will never receive is not left open."""
        thread = self._started()
        if threading.current_thread() is thread:  # a call made from a call: run it here
            return _materialised(fn(*args, **kwargs))
        done = threading.Event()
        box = {}

        def job():
            try:
                box["value"] = _materialised(fn(*args, **kwargs))
            except BaseException as e:  # handed to the caller, whatever it is
                box["error"] = e
            finally:
                done.set()

        self._jobs.put(job)
        interrupted = None
        while True:
            try:
                done.wait()
                break
            except KeyboardInterrupt as e:  # held until the kernel has answered
                interrupted = e
        if interrupted is not None:
            if undo is not None and "value" in box:
                try:
                    self.call(undo, box["value"])
                except Exception:
                    pass
            raise interrupted
        if "error" in box:
            raise box.pop("error")
        return box["value"]


def _materialised(value):
    """pyroute2 answers some requests with a generator that runs the loop as it
    is read: read it on this thread."""
    if inspect.isgenerator(value) or (hasattr(value, "__next__") and not isinstance(value, _ITERATORS)):
        return list(value)
    return value


THREAD = _Thread()


def call(fn, *args, undo=None, **kwargs):
    """fn(*args, **kwargs) on the netlink thread; its result, or its exception."""
    return THREAD.call(fn, *args, undo=undo, **kwargs)


class Netlink:
    """A pyroute2 object made by `factory()` on the netlink thread; every method
    call on it runs there. Use it as the object itself (`ip.link_lookup(...)`,
    `with ... as ip:`)."""

    def __init__(self, factory):
        object.__setattr__(self, "_obj", call(factory, undo=lambda obj: obj.close()))

    def __getattr__(self, name):
        attr = getattr(self._obj, name)
        if not callable(attr):
            return attr

        def method(*args, **kwargs):
            return call(attr, *args, **kwargs)

        method.__name__ = name
        return method

    def close(self):
        call(self._obj.close)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"<Netlink {type(self._obj).__name__} on the lab's netlink thread>"
