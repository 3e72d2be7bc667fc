"""The library's version, the commit it was imported from, and the version
of the numbers it computes."""

from __future__ import annotations

import functools
import re
from pathlib import Path

__version__ = "0.1.0"

_SHA = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")
_OWN_PROJECT = re.compile(r'^name\s*=\s*"optical"\s*$', re.MULTILINE)


@functools.lru_cache(maxsize=1)
def source_commit() -> str | None:
    """The git commit (hex) checked out where this package is imported from:
    what ``__version__``, the same for every commit, cannot tell apart. None
    where the package is not in a git checkout (an installed wheel) or its
    ``.git`` cannot be read, and where the directory above it is not
    optical's own checkout (its ``pyproject.toml`` names another project, or
    none: optical copied into another project's tree). Uncommitted changes
    are not seen. Read from the files under ``.git`` (no ``git`` process)."""
    return checkout_commit(Path(__file__).resolve().parent.parent)


def checkout_commit(root: Path) -> str | None:
    """:func:`commit_of` ``root`` where it is optical's checkout (its
    ``pyproject.toml`` names the project ``optical``), else None."""
    if not _OWN_PROJECT.search(_text(root / "pyproject.toml") or ""):
        return None
    return commit_of(root)


def _text(path: Path, limit: int = 1 << 16) -> str | None:
    """A plain file's text, or None: not a plain file (a FIFO would block),
    larger than ``limit`` bytes, or unreadable."""
    try:
        if not path.is_file() or path.stat().st_size > limit:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeError):
        return None


def commit_of(root: Path) -> str | None:
    """The commit ``root``'s git checkout has checked out (its HEAD: a branch
    in loose or packed refs, or detached; a worktree's or submodule's
    ``.git`` file followed), or None. Reads small plain files only."""
    try:
        git = root / ".git"
        if git.is_file():  # a worktree or a submodule: "gitdir: <path>"
            text = (_text(git) or "").strip()
            if not text.startswith("gitdir:"):
                return None
            gitdir = (root / text.removeprefix("gitdir:").strip()).resolve()
        elif git.is_dir():
            gitdir = git
        else:
            return None
        head = (_text(gitdir / "HEAD") or "").strip()
        if not head.startswith("ref:"):
            return head if _SHA.fullmatch(head) else None
        ref = head.removeprefix("ref:").strip()
        common = gitdir  # a worktree keeps its branches in the main repository's
        if (commondir := _text(gitdir / "commondir")) is not None:
            common = gitdir / commondir.strip()
        for base in (gitdir, common):
            if (sha := _text(base / ref)) is not None:
                sha = sha.strip()
                return sha if _SHA.fullmatch(sha) else None
        for line in (_text(common / "packed-refs", 1 << 26) or "").splitlines():
            sha, _, name = line.partition(" ")  # comments and peeled "^" lines match no ref
            if name == ref and _SHA.fullmatch(sha):
                return sha
    except (OSError, UnicodeError, ValueError):
        return None
    return None


#: Bumped whenever a run's numbers for the same inputs, workload, config and
#: seed change (a physics fix, a metric added or redefined), so that a sweep
#: never mixes runs computed two ways: sweeps record it in their manifest and
#: runs (a resume refuses another), run ids hash it, and ``--json`` reports
#: keep it. 1: sweeps and reports that did not record it (before 2026-12-06);
#: 2: recorded; 3: RoPE frequencies as transformers computes them (bit for bit
#: at Llama's thetas and head sizes; Llama layers' numbers moved in the last
#: bits, growing with the position); 4: validate's (and a layer workload's)
#: held-out calibration input drawn as prompts as long as the scored ones,
#: not one prompt of ``calibration.max_tokens`` tokens (layers scored on
#: fewer tokens than that moved: all-MiniLM-L6-v2's layer 5 at 8 tokens by
#: +5 dB at the output); 5: runs record ``dac_clipped_fraction`` (a matmul
#: run's, and each optical product's and the totals' in a layer run), which
#: runs of 4 lack (a resumed sweep would have mixed rows with and without it).
RESULTS_VERSION = 5
