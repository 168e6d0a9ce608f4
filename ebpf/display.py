"""What a program object shows a person: its repr (in a terminal), its HTML
(under a notebook cell) and its counters as a table. Kept apart from the loader
(program.py), which loads, attaches, detaches and reads; BpfProgram mixes this
in, and a subclass adds its own settings to describe().

    >>> tap                                      # doctest: +SKIP
    <TcMirror: source tc_mirror.bpf.c; attached eth0 ingress (tc); ...; counters seen=1,024 ...>
"""

from html import escape


class Shown:
    """describe(), repr(), _repr_html_() and counters_frame() of a program
    object: what it needs of the object is source_path, bpf, hooks(),
    counters(), counter_rows(), MAIN_COUNTERS and ROWS (BpfProgram's)."""

    def describe(self) -> dict:
        """What repr() shows: the source, where attached, settings (subclasses add
        theirs) and, once loaded, the main counters."""
        d = {
            "source": self.source_path.name,
            "attached": ", ".join(self.hooks()) or ("nowhere (compiled)" if self.bpf else "nowhere (not loaded yet)"),
        }
        return d

    def _shown_counters(self):
        if self.bpf is None:  # reading would compile: a repr must not
            return {}
        try:
            c = self.counters()
        except Exception:
            return {}
        keys = self.MAIN_COUNTERS or tuple(c)
        return {k: c[k] for k in keys if k in c}

    def __repr__(self):
        try:
            d = self.describe()
            shown = self._shown_counters()
        except Exception as e:  # a repr never raises
            return f"<{type(self).__name__} ({e})>"
        parts = [f"{k} {v}" for k, v in d.items()]
        if shown:
            parts.append("counters " + " ".join(f"{k}={v:,}" for k, v in shown.items()))
        return f"<{type(self).__name__}: " + "; ".join(parts) + ">"

    def _repr_html_(self):
        try:
            d, shown = self.describe(), self._shown_counters()
        except Exception as e:
            return f"<b>{type(self).__name__}</b> ({escape(str(e))})"
        rows = "".join(
            f"<tr><th style='text-align:left'>{escape(k)}</th><td style='text-align:left'>{escape(str(v))}</td></tr>"
            for k, v in d.items()
        )
        if shown:
            rows += (
                "<tr><th style='text-align:left'>counters</th><td style='text-align:left'>"
                + ", ".join(f"{escape(k)} {v:,}" for k, v in shown.items())
                + "</td></tr>"
            )
        return f"<b>{escape(type(self).__name__)}</b><table>{rows}</table>"

    def counters_frame(self):
        """counter_rows() as a pandas DataFrame: a row per ROWS, a column per counter."""
        import pandas as pd  # noqa: PLC0415 -- heavy; only this optional view needs pandas

        rows = self.counter_rows()
        frame = pd.DataFrame.from_dict(rows, orient="index")
        frame.index.name = self.ROWS
        return frame
