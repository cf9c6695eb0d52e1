"""Password and ACL files for brokers with authentication, written the way an operator would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.broker import REPO_ROOT


def write_passwd(path: Path, users: dict[str, str]) -> Path:
    """Add each user to ``path`` with ``meshmq passwd`` (scrypt), as an operator would."""
    for user, password in users.items():
        res = subprocess.run([sys.executable, "-m", "meshmq", "passwd", str(path), user],
                             input=password + "\n", capture_output=True, text=True, timeout=60,
                             cwd=str(REPO_ROOT))
        assert res.returncode == 0, (
            f"`python -m meshmq passwd {path} {user}` failed ({res.returncode}): {res.stderr}")
    return path


def auth_overrides(directory: Path, users: dict[str, str], acl: str | None = None,
                   **auth: object) -> dict[str, object]:
    """Config overrides for a broker with a password file (and an ACL file when given)."""
    directory.mkdir(parents=True, exist_ok=True)
    section: dict[str, object] = {"allow_anonymous": False,
                                  "password_file": str(write_passwd(directory / "passwd", users))}
    if acl is not None:
        (directory / "acl").write_text(acl)
        section["acl_file"] = str(directory / "acl")
    section.update(auth)
    return {"auth": section}
