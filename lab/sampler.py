"""Counters over time: the interactive form of what the benches measure.

    >>> rates = Sampler(tap).run(3)          # doctest: +SKIP  (3 s, a row every 0.5 s)
    >>> rates.plot()                          # pps and Mbps, one line per counter that moved
    >>> live(tap, seconds=30)                 # a table that updates in place; Interrupt stops it

A source is a kernel program (anything with counters(), and counter_rows() for
by_row=True: ebpf.TcMirror, XdpRedirect, XdpLoadBalancer, ...) or a function
returning {counter: value} or {row: {counter: value}}. Counters only grow; a rate
is the difference between two reads over the time between them: packets (and
other events) per second, and Mbps for counters whose name ends in "bytes".
Sampling reads counters and nothing else: the program stays attached and
usable whatever happens to the sampler, an Interrupt included.
"""

import threading
import time
from html import escape
from itertools import pairwise

import pandas as pd

from .awaitable import in_thread

MAX_SECONDS = 600.0  # no sampling runs longer than this
MIN_INTERVAL = 0.05


def _rate_name(counter):
    if counter == "bytes":
        return "Mbps"
    if counter.endswith("_bytes"):
        return f"{counter[: -len('_bytes')]} Mbps"
    return f"{counter} pps"


class Sampler:
    """Reads a source's counters every `interval` seconds into `counts` and
    `rates` (pandas DataFrames indexed by seconds since the first read).

    by_row: one column per row and counter (per interface, backend, rule, as
    the program counts them), else the totals. counters: the counters to keep
    (default: all of them)."""

    def __init__(self, source, interval=0.5, by_row=False, counters=None):
        if not interval or interval < MIN_INTERVAL:
            raise ValueError(f"interval must be at least {MIN_INTERVAL} s, not {interval!r}")
        self.source, self.interval, self.by_row = source, float(interval), by_row
        self.keep = set(counters) if counters else None
        self.times: list[float] = []
        self.reads: list[dict] = []
        self.interrupted = False
        self._t0 = None
        self._stop = threading.Event()
        self._thread = None

    # --- reading ------------------------------------------------------------------
    def read(self) -> dict:
        """{(row, counter): value} now (row "" for totals)."""
        src = self.source
        if callable(src) and not hasattr(src, "counters"):
            got = src()
            rows = got if got and all(isinstance(v, dict) for v in got.values()) else {"": got}
        elif self.by_row:
            rows = src.counter_rows()
        else:
            rows = {"": src.counters()}
        return {
            (row, k): v
            for row, c in rows.items()
            for k, v in c.items()
            if isinstance(v, (int, float)) and (self.keep is None or k in self.keep)
        }

    def sample_once(self):
        now = time.monotonic()
        values = self.read()
        if self._t0 is None:
            self._t0 = now
        self.times.append(now - self._t0)
        self.reads.append(values)

    # --- running --------------------------------------------------------------------
    def run(self, seconds):
        """Sample in this thread for `seconds` (bounded by MAX_SECONDS). An
        Interrupt (Ctrl-C, a notebook's stop button) ends it early: what was
        read is kept, `interrupted` says so. Returns `rates`."""
        self._run(seconds)
        return self.rates

    def _run(self, seconds, each=None, read_first=True):
        seconds = self._bounded(seconds)
        try:
            if read_first:
                self.sample_once()
            deadline = time.monotonic() + seconds
            while not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._stop.wait(min(self.interval, left))
                self.sample_once()
                if each is not None:
                    each(self)
        except KeyboardInterrupt:
            self.interrupted = True

    @staticmethod
    def _bounded(seconds):
        if seconds is None or seconds <= 0:
            raise ValueError(f"seconds must be positive, not {seconds!r}")
        if seconds > MAX_SECONDS:
            raise ValueError(f"sampling is bounded at {MAX_SECONDS:.0f} s, not {seconds}")
        return float(seconds)

    async def arun(self, seconds):
        """run() without blocking the caller's event loop: `await` it in a
        notebook cell, or beside traffic in asyncio.gather()."""
        self._stop.clear()
        await in_thread(self._run, seconds, stop=self._stop)
        return self.rates

    def start(self, seconds=MAX_SECONDS):
        """Sample in a background thread until stop() (or `seconds`)."""
        if self._thread is not None:
            raise RuntimeError("this sampler is already running")
        seconds = self._bounded(seconds)
        self._stop.clear()
        # The first read here, before start() returns: read by the thread, it could
        # come after the first packets of the traffic the caller starts next
        # (`with Sampler(tap): tb.send(...)`), which the counts would then miss.
        self.sample_once()
        self._thread = threading.Thread(target=self._run, args=(seconds, None, False), name="lab-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Stop a start()ed sampler (one last read); returns `rates`."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample_once()
        return self.rates

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    # --- results --------------------------------------------------------------------
    def _label(self, row, counter):
        return f"{row} {counter}" if row else counter

    @property
    def counts(self):
        """The counters as read: one row per read, one column per (row) counter."""
        frame = pd.DataFrame(
            [{self._label(*k): v for k, v in r.items()} for r in self.reads], index=pd.Index(self.times, name="seconds")
        )
        return frame

    @property
    def rates(self):
        """Per second between reads: pps per counter, Mbps for byte counters.
        Columns that stayed at zero throughout are left out (all of them are
        kept when nothing moved)."""
        if len(self.reads) < 2:
            return pd.DataFrame(index=pd.Index([], name="seconds"))
        keys = list(self.reads[0])
        rows = []
        # consecutive reads; times and reads grow together (sample_once)
        for (t0, r0), (t1, r1) in pairwise(zip(self.times, self.reads, strict=True)):
            dt = t1 - t0
            row = {}
            for row_name, counter in keys:
                delta = r1.get((row_name, counter), 0) - r0.get((row_name, counter), 0)
                value = delta * 8 / 1e6 / dt if counter.endswith("bytes") else delta / dt
                row[self._label(row_name, _rate_name(counter))] = value
            rows.append(row)
        frame = pd.DataFrame(rows, index=pd.Index(self.times[1:], name="seconds"))
        moved = frame.loc[:, (frame != 0).any()]
        return moved if moved.shape[1] else frame

    def __repr__(self):
        state = "running" if self._thread is not None else f"{len(self.reads)} reads"
        return f"<Sampler every {self.interval:g} s: {state}{', interrupted' if self.interrupted else ''}>"


def sample(source, seconds, interval=0.5, by_row=False, counters=None):
    """Sampler(source, interval, by_row, counters).run(seconds): a DataFrame of rates."""
    return Sampler(source, interval, by_row, counters).run(seconds)


def _table_html(sampler):
    last = sampler.reads[-1] if sampler.reads else {}
    rates = sampler.rates
    rate_row = rates.iloc[-1] if len(rates) else {}
    body = "".join(
        f"<tr><td>{escape(sampler._label(row, c))}</td><td style='text-align:right'>{v:,}</td>"
        f"<td style='text-align:right'>{_fmt(rate_row, sampler._label(row, _rate_name(c)))}</td></tr>"
        for (row, c), v in last.items()
    )
    t = sampler.times[-1] if sampler.times else 0.0
    status = " (interrupted)" if sampler.interrupted else ""
    return (
        f"<b>{escape(_name(sampler.source))}</b>, {t:.1f} s{status}<table><tr><th>counter</th>"
        f"<th>value</th><th>rate</th></tr>{body}</table>"
    )


def _fmt(row, label):
    try:
        v = row[label]
    except (KeyError, IndexError, TypeError):
        return ""
    unit = "Mbps" if label.endswith("Mbps") else "/s"
    return f"{v:,.1f} {unit}"


def _name(source):
    return type(source).__name__ if hasattr(source, "counters") else getattr(source, "__name__", "counters")


def live(source, seconds=30, interval=1.0, by_row=False, counters=None):
    """A table of the counters and their rates that updates in place in the
    notebook cell (a line per read elsewhere) for `seconds`; Interrupt stops it
    early. The program stays attached. Returns the Sampler (its counts and
    rates cover the whole view)."""
    sampler = Sampler(source, interval, by_row, counters)
    try:
        from IPython import get_ipython  # noqa: PLC0415 -- optional: only a notebook kernel has it
        from IPython.display import HTML, display  # noqa: PLC0415 -- optional: only a notebook kernel has it

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None and shell.__class__.__name__ != "TerminalInteractiveShell":
        handle = display(HTML(_table_html(sampler)), display_id=True)

        def each(s):
            handle.update(HTML(_table_html(s)))
    else:

        def each(s):
            r = s.rates
            last = r.iloc[-1] if len(r) else {}
            print(f"{s.times[-1]:6.1f} s  " + "  ".join(f"{k} {last[k]:,.1f}" for k in r.columns), flush=True)

    sampler._run(seconds, each)
    if sampler.interrupted and shell is not None and shell.__class__.__name__ != "TerminalInteractiveShell":
        handle.update(HTML(_table_html(sampler)))
    return sampler
