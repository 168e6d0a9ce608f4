"""`vtap` (pyproject's console script) and `python -m vtap`: the vTAP's command,
lab.fastpaths.vtap.command."""

from lab.fastpaths.vtap.command import COMMAND


def cli(argv=None):
    return COMMAND.cli(argv)
