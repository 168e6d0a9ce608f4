"""python -m lab bench hosts-parity: the vTAP throughput bench through the lab's
namespace-hosts rack (Ansible, sshd, a runner per role: the path a bench takes on
real machines) and through namespaces, in alternating rounds on this machine, so
that the hosts path can be held to the namespace path's figures and its
orchestration measured against the namespace path's own.

Both paths run the same kernel on the same cores: what differs is only how a run
is driven. The rack is built and set up by the bench itself (lab.hosts.nshosts,
`hosts setup` on one host from a wheelhouse, copied to the others) and removed at
its end."""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from ..metrics import read_results, write_results
from ..netns import LabError
from .common import Progress, add_options, checked_options, parse_list, span

NAME = "hosts-parity"
SUMMARY = "the vTAP bench on namespaces as hosts against the namespace path: figures and orchestration"
DESCRIPTION = """\
Rounds that alternate (which path goes first alternates too): one trial of every
mirror and size through the namespace-hosts rack (`bench vtap-throughput -i`, in
the rack's controller namespace), and one through namespaces (`bench
vtap-throughput`). Per path: receiver and monitor packets/s (medians over rounds,
min..max) and each run's time beyond its --duration (run_wall_s - duration_s);
the targets: the hosts path's medians within 5 % of the namespace path's, and at
most 2 s more per run. Builds the rack (four namespaces with sshd; `hosts setup`
on one from a wheelhouse, about a minute) and removes it at the end."""
EXAMPLES = """\
examples:
  python -m lab bench hosts-parity                          # 64 B, none/ebpf/tc-mirred, 5 rounds of 2 s runs
  python -m lab bench hosts-parity --sizes 64,1518 --rounds 7 --out datasets/reference
  python -m lab bench hosts-parity --wheelhouse /tmp/wh     # wheels from `pip download -d /tmp/wh . pip setuptools`
"""
REPO = Path(__file__).resolve().parents[2]
PARITY = 0.05  # the hosts path's medians within 5 % of the namespace path's
ORCHESTRATION_S = 2.0  # at most 2 s more per run than the namespace path
DUT_CPU = 1  # the DUT's core in both paths (vtap-throughput's --cpus default: generator 0, DUT 1)


def _off_dut_core():
    """In the controller's child: every core but the DUT's (vtap-throughput's default, 1)."""
    cores = os.sched_getaffinity(0) - {DUT_CPU}
    if cores:
        os.sched_setaffinity(0, cores)


def add_arguments(p):
    p.description, p.epilog, p.formatter_class = DESCRIPTION, EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument("--sizes", default="64", help="frame sizes in bytes with FCS (default %(default)s)")
    add_options(p, trials=5, duration=2.0, peers=["none", "ebpf", "tc-mirred"])
    p.add_argument("--rounds", type=int, default=None, help="rounds of both paths (default: --trials)")
    p.add_argument("--rate", type=int, default=None, help="frames/s offered (default: the generator's ceiling)")
    p.add_argument("--wheelhouse", help="a directory of wheels for the rack's set-up (default: pip download)")


def main(a):
    from ..fastpaths.vtap.bench import HOSTS_MIRRORS  # noqa: PLC0415

    sizes = parse_list(a.sizes, int, what="size")
    mirrors, _ = checked_options(a, list(HOSTS_MIRRORS), "mirror")
    rounds = a.rounds or a.trials
    if rounds < 1 or (a.rate is not None and a.rate <= 0):
        raise ValueError("--rounds and --rate: positive numbers")
    df, path = run(sizes, mirrors, rounds, a.duration, a.rate, a.wheelhouse, a.out)
    for line in summary(df):
        print(line)
    print(f"\nwrote {path} and {path.with_suffix('.json').name}")
    return 0


def _wheelhouse(d: Path) -> Path:
    p = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-d", str(d), str(REPO), "pip", "setuptools"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if p.returncode:
        tail = (p.stderr.strip().splitlines() or ["(nothing said)"])[-1]
        raise LabError(f"pip download for the rack's wheelhouse failed: {tail}; fix: --wheelhouse DIR")
    return d


def _ok(p, what):
    if p.returncode:
        said = (p.stderr.strip() or p.stdout.strip()).splitlines() or ["(nothing said)"]
        raise LabError(f"{what} failed (exit {p.returncode}): {said[-1]}")
    return p


def run(sizes, mirrors, rounds, duration, rate=None, wheelhouse=None, out=None, progress=True):
    from ..fastpaths.vtap import bench as vt  # noqa: PLC0415 -- the bench both paths run
    from ..hosts.nshosts import NamespaceHosts  # noqa: PLC0415

    frames, timing = [], []
    bar = Progress(2 * rounds) if progress else None
    with tempfile.TemporaryDirectory(prefix="vtl-parity-") as tmp:
        tmp = Path(tmp)
        wheels = Path(wheelhouse) if wheelhouse else _wheelhouse(tmp / "wheels")
        rack = NamespaceHosts().build()
        try:
            env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_NO_COMPILE": "1"}
            first = rack.write_inventory(
                rack.base / "first.yml", roles={"sender": {"alpha": {}}}, extra_vars={"lab_setup_env": env}
            )
            lab = [sys.executable, "-m", "lab"]
            _ok(
                rack.run_controller([*lab, "hosts", "setup", "-i", str(first), "--dirty"], cwd=REPO, timeout=1800),
                "hosts setup on the rack",
            )
            rack.copy_lab("alpha", *[n for n in rack.names if n != "alpha"])
            common = ["--sizes", ",".join(map(str, sizes)), "--peers", ",".join(mirrors), "--trials", "1"]
            common += ["--duration", str(duration), *(["--rate", str(rate)] if rate else [])]
            for r in range(rounds):
                for place in ("hosts", "namespaces") if r % 2 == 0 else ("namespaces", "hosts"):
                    started = time.monotonic()
                    out_dir = tmp / f"{place}-{r}"
                    if place == "hosts":
                        argv = [*lab, "bench", "vtap-throughput", "-i", str(rack.inventory), *common]
                        # the controller (Ansible) off the DUT's core, as on a machine of its own:
                        # it polls its workers every millisecond while a task runs (the `go` of
                        # every run, through the load window)
                        _ok(
                            rack.run_controller(
                                [*argv, "--out", str(out_dir)], cwd=REPO, timeout=3600, preexec_fn=_off_dut_core
                            ),
                            f"round {r} on the rack",
                        )
                        (csv,) = out_dir.glob("vtap_throughput-*.csv")
                        df, _ = read_results(csv)
                    else:
                        with open(os.devnull, "w") as quiet:  # its own summary: not this bench's
                            df, _ = vt.run(
                                [1],
                                sizes,
                                mirrors,
                                1,
                                duration,
                                out=out_dir,
                                progress=False,
                                rate_pps=rate,
                                stream=quiet,
                            )
                    frames.append(df.assign(place=place, round=r))
                    timing.append({"place": place, "round": r, "wall_s": round(time.monotonic() - started, 3)})
                    if bar:
                        bar.step(f"round {r} {place}")
        finally:
            rack.close()
    df = pd.concat(frames, ignore_index=True)
    df["overhead_s"] = df["run_wall_s"] - df["duration_s"]
    params = {
        "sizes": sizes,
        "mirrors": mirrors,
        "rounds": rounds,
        "duration_s": duration,
        "rate_pps": rate,
        "rack": "lab.hosts.nshosts: four namespaces with sshd on this machine, reached by Ansible",
    }
    return df, write_results(df, "hosts_parity", params, out, extra={"rounds": timing})


def summary(df) -> list[str]:
    """Per mirror and size: each path's medians [min..max] and the ratio; then each
    path's time beyond --duration per run, and the targets."""
    out = [
        "median [min..max] over rounds; kpps",
        f"{'size':>5} {'mirror':<10} {'where':<8} {'hosts':>22} {'namespaces':>22} {'ratio':>6}",
    ]
    worst = 0.0
    for (size, mirror), d in df.groupby(["size", "mirror"]):
        for col in ("receiver_pps", "monitor_pps"):
            if mirror == "none" and col == "monitor_pps":
                continue
            s = d.groupby("place")[col].agg(["median", "min", "max"])
            h, n = s.loc["hosts"], s.loc["namespaces"]
            ratio = h["median"] / n["median"] if n["median"] else float("nan")
            worst = max(worst, abs(ratio - 1))
            h_span, n_span = (span({f"{col}_{k}": v for k, v in x.items()}, col, 1e3) for x in (h, n))
            out.append(f"{size:>5} {mirror:<10} {col.split('_')[0]:<8} {h_span:>22} {n_span:>22} {ratio:>6.3f}")
    o = df.groupby("place")["overhead_s"].median()
    extra = o["hosts"] - o["namespaces"]
    out += [
        "",
        f"time beyond --duration per run (median): hosts {o['hosts']:.2f} s, namespaces {o['namespaces']:.2f} s",
        "targets:",
        f"  hosts within {PARITY:.0%} of namespaces (every median): worst {worst:.1%} "
        + ("met" if worst <= PARITY else "MISSED"),
        f"  orchestration beyond the namespace path <= {ORCHESTRATION_S:g} s: {extra:.2f} s "
        + ("met" if extra <= ORCHESTRATION_S else "MISSED"),
    ]
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m lab bench hosts-parity")
    add_arguments(p)
    sys.exit(main(p.parse_args()))
