"""How a person calls this tierq from their shell, for the commands tierq prints."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def tierq_command() -> str:
    """``tierq`` when that name finds this installation (an activated venv, a ``pip
    install``), else the path of its script (``make up`` runs ``.venv/bin/tierq`` with no venv
    active), relative to the working directory when it lies below it."""
    script = Path(sys.executable).parent / "tierq"
    found = shutil.which("tierq")
    if not script.exists() or (found is not None
                               and Path(found).resolve() == script.resolve()):
        return "tierq"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)
