"""Shell snippets the integrations' scripts share.  No I/O, no integration package imported."""

from __future__ import annotations

import errno
import shlex


def cwd_errno(path: str, var: str = "__fm_e") -> str:
    """A shell line that sets ``$VAR`` to the errno ``chdir(path)`` failed with, as
    ``subprocess.run(cwd=path)`` would raise it: EACCES for a directory (it exists, so it was
    denied), ENOTDIR for anything else that exists, else ENOENT.  Run it only after a failed
    ``cd``."""
    q = shlex.quote(path)
    return (f"if [ -d {q} ]; then {var}={errno.EACCES}; elif [ -e {q} ]; then {var}={errno.ENOTDIR}; "
            f"else {var}={errno.ENOENT}; fi")
