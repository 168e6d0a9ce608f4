"""Where the lab is: its checkout (or installed package's parent) and what follows
from it. Its own module, importing nothing, so that a process started in a
namespace (a generator's, a server's) finds the checkout without loading pandas."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IN_CHECKOUT = (REPO / "pyproject.toml").exists()  # False for an installed wheel (site-packages)
