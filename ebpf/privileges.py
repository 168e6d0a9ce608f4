"""Does this process have what BPF programs and TC/XDP hooks need?

Checked from the capability set, not the user id: root without capabilities (a
container, `setpriv --inh-caps=-all`) fails the same way a normal user does. No
imports beyond the standard library, so that a command line can check this
before it imports anything heavier.
"""

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
CAP_BPF = 39  # kernel 5.8+; before that, CAP_SYS_ADMIN covered BPF

NEEDS = "CAP_BPF and CAP_NET_ADMIN, which root has"


def effective_caps() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def missing() -> list[str]:
    """Names of the capabilities this process lacks for loading and attaching."""
    caps = effective_caps()
    has = lambda cap: bool(caps >> cap & 1)  # noqa: E731
    out = []
    if not (has(CAP_BPF) or has(CAP_SYS_ADMIN)):
        out.append("CAP_BPF")
    if not has(CAP_NET_ADMIN):
        out.append("CAP_NET_ADMIN")
    return out


def message() -> str | None:
    """One line saying what is missing, or None when nothing is."""
    lacking = missing()
    if not lacking:
        return None
    return (
        f"must run as root (loading BPF programs and changing TC hooks needs {NEEDS}; this process lacks "
        f"{' and '.join(lacking)})"
    )
