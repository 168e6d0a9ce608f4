"""What `hosts setup` puts on a host: the controller's tracked files at its commit.

A checkout is identified by its tree (git's hash of the tracked files' content),
not only its commit: `--dirty` puts a working tree's uncommitted changes to tracked
files on the hosts (a commit of them made through an index of its own, which
touches neither the working tree, the index nor the stash: `git stash create` refuses
a file added with `git add -N`), and what is on a host is then the same as here exactly when
the trees are. Untracked files never go (git archive takes tracked files only).
"""

import io
import json
import socket
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from lab.paths import REPO

from .inventory import InventoryError

STAMP = ".lab-commit"  # the tree a host's lab_dir holds
SETUP_STAMP = ".lab-setup"  # the tree whose scripts/setup.sh last succeeded there
FILES = ".lab-files"  # the files it holds (the next setup removes those a new tree lacks)
SOURCE = ".lab-source"  # for people: commit, tree, dirty, when, from where


def _git(*args, repo=REPO, strip=True) -> str:
    p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise InventoryError(f"git {' '.join(args)} in {repo}: {p.stderr.strip() or 'failed'}")
    return p.stdout.strip() if strip else p.stdout


@dataclass
class Source:
    repo: Path
    commit: str  # HEAD
    tree: str  # the tracked files' tree, changes included when dirty
    ref: str  # what git archive takes: HEAD, or the stash-create commit
    dirty: list  # tracked files changed and not committed

    def describe(self) -> str:
        n = len(self.dirty)
        extra = f", with {n} uncommitted change{'s' if n != 1 else ''}" if n else ""
        return f"commit {self.commit[:12]}{extra} (tree {self.tree[:12]})"


def current(allow_dirty=False, repo=REPO) -> Source:
    """The controller's source; a tree with uncommitted changes to tracked files is
    refused unless allow_dirty (then those changes go too)."""
    repo = Path(repo)
    if not (repo / ".git").exists():
        raise InventoryError(
            f"{repo} is not a git checkout: hosts get the controller's commit (git archive); "
            "fix: run the lab from a clone of its repository"
        )
    commit = _git("rev-parse", "HEAD", repo=repo)
    dirty = [
        ln[3:]
        for ln in _git("status", "--porcelain", "--untracked-files=no", repo=repo, strip=False).splitlines()
        if ln
    ]
    if dirty and not allow_dirty:
        raise InventoryError(
            f"the checkout has uncommitted changes to {len(dirty)} tracked file{'s' if len(dirty) > 1 else ''} "
            f"({', '.join(dirty[:3])}{', ...' if len(dirty) > 3 else ''}): hosts run a commit, so that every "
            "result names the code that made it; fix: commit them (or --dirty to send them as they are)"
        )
    ref = _snapshot(repo, commit) if dirty else "HEAD"
    return Source(repo, commit, _git("rev-parse", f"{ref}^{{tree}}", repo=repo), ref, dirty)


def _snapshot(repo, head) -> str:
    """A commit of the tracked files as they are in the working tree (staged or not,
    new ones added with -N too), made in a copy of the index: nothing of the user's changes."""
    import os  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    index = Path(_git("rev-parse", "--git-path", "index", repo=repo))
    index = index if index.is_absolute() else repo / index
    with tempfile.TemporaryDirectory() as tmp:
        mine = Path(tmp) / "index"
        if index.exists():
            shutil.copyfile(index, mine)
        env = {**os.environ, "GIT_INDEX_FILE": str(mine)}

        def git(*args):
            p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env)
            if p.returncode != 0:
                raise InventoryError(f"git {' '.join(args)} in {repo}: {p.stderr.strip() or 'failed'}")
            return p.stdout.strip()

        git("add", "-u")
        tree = git("write-tree")
        return git("commit-tree", tree, "-p", head, "-m", "lab hosts setup --dirty: the working tree's tracked files")


def archive(source: Source, dest: Path) -> list[str]:
    """A tar.gz of the source's tracked files and the lab's stamps, at `dest`; returns its file list."""
    raw = subprocess.run(
        ["git", "-C", str(source.repo), "archive", "--format=tar", source.ref], capture_output=True, check=True
    ).stdout
    names = []
    with tarfile.open(fileobj=io.BytesIO(raw)) as src, tarfile.open(dest, "w:gz", compresslevel=1) as out:
        for member in src.getmembers():
            out.addfile(member, src.extractfile(member) if member.isfile() else None)
            if not member.isdir():
                names.append(member.name)
        stamps = {
            STAMP: source.tree + "\n",
            FILES: "\n".join(sorted(names)) + "\n",
            SOURCE: json.dumps(
                {
                    "commit": source.commit,
                    "tree": source.tree,
                    "dirty": source.dirty,
                    "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "controller": socket.gethostname(),
                },
                indent=1,
            )
            + "\n",
        }
        for name, text in stamps.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            out.addfile(info, io.BytesIO(data))
    return names
