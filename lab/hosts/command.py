"""python -m lab hosts: the lab on the user's own machines, named in an Ansible inventory.

    python -m lab hosts check -i hosts.yml --bench vtap-throughput
    python -m lab hosts setup -i hosts.yml
    python -m lab hosts facts -i hosts.yml --json
    python -m lab hosts cleanup -i hosts.yml

Exit status: 0 done (check: the bench can run); 1 a host has a problem or a step
failed there (each said in one line, with its fix); 2 the command or the inventory
as given cannot be used.
"""

import argparse
import json
import sys

EXAMPLES = """\
examples:
  python -m lab hosts check -i hosts.yml                        # every host with a role: ready?
  python -m lab hosts check -i hosts.yml --bench vtap-throughput
  python -m lab hosts setup -i hosts.yml                        # this commit into each lab_dir, set up
  python -m lab hosts facts -i hosts.yml --json > facts.json    # what check reads, per host
  python -m lab hosts cleanup -i hosts.yml                      # the lab's leftovers removed, interfaces put back

The inventory is Ansible's (YAML or INI; groups are roles: sender, tap, receiver,
monitor, nodes); docs/hosts.md has one per bench and a walk-through.
"""


def add_arguments(p):
    p.description = (
        "The lab on your own machines: an Ansible inventory names them and the roles they play; "
        "Ansible reaches them over ssh as you do."
    )
    p.epilog, p.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    sub = p.add_subparsers(dest="action", required=True, title="actions")
    for name, text in (
        ("check", "per host: reachable, root, system, kernel, the lab, each named interface; exit 0 when ready"),
        ("setup", "this checkout's commit into each host's lab_dir, and scripts/setup.sh run there"),
        ("facts", "what check reads, per host (the record benches keep in their sidecars)"),
        ("cleanup", "the lab's cleanup on every host, and every interface it changed put back"),
    ):
        s = sub.add_parser(name, help=text, description=text, error_name=f"lab hosts {name}")
        s.add_argument("-i", "--inventory", required=True, metavar="FILE", help="an Ansible inventory")
        if name in ("check", "facts"):
            s.add_argument("--bench", choices=["vtap-throughput", "pods"], help="judge the hosts for this bench")
        if name in ("check", "facts", "setup", "cleanup"):
            s.add_argument("--json", action="store_true", help="one JSON document instead of the table")
        if name == "check":
            s.add_argument(
                "--generator",
                choices=["xdp", "trafgen"],
                default="xdp",
                help="the bench's packet source (default %(default)s): the XDP generator needs a "
                "sender driver that takes redirected XDP frames",
            )
        if name == "setup":
            s.add_argument(
                "--dirty",
                action="store_true",
                help="send uncommitted changes to tracked files too (refused without it)",
            )


def main(args):
    from . import Hosts, InventoryError  # noqa: PLC0415 -- Ansible's modules: only for this command

    try:
        hosts = Hosts(args.inventory)
        return {"check": _check, "setup": _setup, "facts": _facts, "cleanup": _cleanup}[args.action](hosts, args)
    except InventoryError as e:
        print(f"lab hosts: error: {e}", file=sys.stderr)
        return 2


def _check(hosts, args):
    report = hosts.check(args.bench, generator=args.generator)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1, default=str))
    else:
        print(f"{'host':<12} {'roles':<24} {'state':<12} system")
        for line in report.lines():
            print(line)
        print(
            f"\n{'ready' if report.ok else 'not ready'}"
            f"{' for ' + args.bench if args.bench else ''}; Ansible's record: {report.artifacts}"
        )
    for line in report.problems():
        print(f"lab hosts check: {line}", file=sys.stderr)
    return 0 if report.ok else 1


def _setup(hosts, args):
    done = hosts.setup(allow_dirty=args.dirty)
    if args.json:
        print(json.dumps({"hosts": done, "artifacts": hosts.last_artifacts}, indent=1))
    else:
        for h, what in done.items():
            print(f"{h}: {what if what in ('set up', 'unchanged') else 'failed: ' + what}")
        if all(w == "unchanged" for w in done.values()):
            print("nothing to do: every host has this tree, set up")
    return 0 if all(w in ("set up", "unchanged") for w in done.values()) else 1


def _facts(hosts, args):
    from . import facts_frame as hosts_frame  # noqa: PLC0415 -- see main()

    record = hosts.facts(args.bench, frame=False)
    if args.json:
        print(json.dumps(record, indent=1, default=str))
    else:
        with __import__("pandas").option_context("display.width", 200, "display.max_columns", 20):
            print(hosts_frame(record).to_string(index=False))
    for h, line in record["unreachable"].items():
        print(f"lab hosts facts: {h}: {line}", file=sys.stderr)
    return 0 if not record["unreachable"] else 1


def _cleanup(hosts, args):
    done = hosts.cleanup()
    if args.json:
        print(json.dumps({"hosts": done, "artifacts": hosts.last_artifacts}, indent=1))
    else:
        for h, what in done.items():
            if isinstance(what, str):
                print(f"{h}: failed: {what}")
            else:
                print(f"{h}: {'; '.join(what) if what else 'nothing to clean up'}")
    return 0 if all(not isinstance(w, str) for w in done.values()) else 1
