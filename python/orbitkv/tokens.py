"""Reading the Manager's token file as the CLI commands do."""

from __future__ import annotations

import os


def read_token_file(path: str) -> str:
    """The token in `path`, refusing a file group/others may access (as the Manager does)."""
    with open(path) as f:
        mode = os.fstat(f.fileno()).st_mode & 0o7777
        if mode & 0o077:
            raise PermissionError(
                f"token file {path} is accessible by group/others (mode {mode:04o}), so they may read the token; "
                f"run `chmod 600 {path}`"
            )
        return f.read().strip()
