"""Extract the DAVIS-2016 *dev split* (40 sequences, 480p) from a local git mirror into a cache outside the repo.

The data is CC BY-NC 4.0 (evaluation use); it is never committed and never copied into the repository.  The
source is a git directory holding DAVIS (see ``docs/davis.md``)::

    git clone https://github.com/xmican10/KNN-project
    cd KNN-project && git checkout 80880aeb900a0a1a7b010f111d4f33d0a5d25e05

    python benchmarks/davis_data.py --git-dir KNN-project/.git [--cache ~/.cache/vostream/davis2016-dev]

Layout written: ``<cache>/JPEGImages/<seq>/00000.jpg ...`` and ``<cache>/Annotations/<seq>/00000.png ...``
(nonzero = object).  Only the 40 dev sequences below can be extracted; the remaining sequences of that folder are
reserved for independent evaluation and this script refuses them.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

COMMIT = "80880aeb900a0a1a7b010f111d4f33d0a5d25e05"
DEFAULT_CACHE = Path(os.environ.get("VOSTREAM_DAVIS", "~/.cache/vostream/davis2016-dev")).expanduser()

# The dev split: tune and report on these only.  Hard-coded on purpose.
DEV_SPLIT: tuple[str, ...] = (
    "bear",
    "bmx-bumps",
    "boat",
    "breakdance-flare",
    "bus",
    "car-roundabout",
    "car-turn",
    "cows",
    "dance-jump",
    "dance-twirl",
    "dog-agility",
    "drift-chicane",
    "drift-straight",
    "drift-turn",
    "elephant",
    "flamingo",
    "hike",
    "hockey",
    "horsejump-high",
    "horsejump-low",
    "kite-surf",
    "kite-walk",
    "lucia",
    "mallard-fly",
    "mallard-water",
    "motocross-bumps",
    "motocross-jump",
    "motorbike",
    "paragliding-launch",
    "paragliding",
    "rhino",
    "rollerblade",
    "scooter-black",
    "scooter-gray",
    "soccerball",
    "stroller",
    "surf",
    "swing",
    "tennis",
    "train",
)
assert len(DEV_SPLIT) == 40 and len(set(DEV_SPLIT)) == 40

#: The cross-validation folds of the dev split: 4 x 10 sequences, the alphabetical list dealt out in turn (fixed, so
#: that figures from different sessions are comparable).  Parameters are chosen on three folds and reported on the
#: fourth, rotating (``benchmarks/davis_cv.py``).
FOLDS: tuple[tuple[str, ...], ...] = tuple(tuple(sorted(DEV_SPLIT)[k::4]) for k in range(4))


def check_names(names: list[str]) -> list[str]:
    """``names`` if every one is a dev-split sequence; ValueError otherwise."""
    bad = [n for n in names if n not in DEV_SPLIT]
    if bad:
        raise ValueError(f"not in the DAVIS-2016 dev split (refused): {', '.join(bad)}")
    return list(names)


def _complete(cache: Path, seq: str) -> bool:
    return (cache / ".done" / seq).exists()


def extract(git_dir: Path, cache: Path, names: list[str] | None = None, commit: str = COMMIT) -> list[str]:
    """Extract ``names`` (default: the whole dev split) into ``cache``; returns the sequences written."""
    names = check_names(names or list(DEV_SPLIT))
    todo = [n for n in names if not _complete(cache, n)]
    if not todo:
        return []
    paths = [f"DAVIS/{kind}/480p/{seq}" for seq in todo for kind in ("JPEGImages", "Annotations")]
    proc = subprocess.run(
        ["git", "--git-dir", str(git_dir), "archive", "--format=tar", commit, "--", *paths],
        capture_output=True,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(f"git archive failed: {proc.stderr.decode(errors='replace').strip()}")
    allowed = set(todo)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout), mode="r:") as tar:
        for member in tar:
            if not member.isfile():
                continue
            parts = Path(member.name).parts  # DAVIS, kind, 480p, seq, file
            if len(parts) != 5 or parts[3] not in allowed or parts[1] not in ("JPEGImages", "Annotations"):
                raise RuntimeError(f"unexpected archive member {member.name!r}")
            dest = cache / parts[1] / parts[3] / parts[4]
            dest.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            assert src is not None
            tmp = dest.with_suffix(dest.suffix + ".part")
            tmp.write_bytes(src.read())
            tmp.replace(dest)
    (cache / ".done").mkdir(parents=True, exist_ok=True)
    for seq in todo:
        n_img = len(list((cache / "JPEGImages" / seq).glob("*.jpg")))
        n_ann = len(list((cache / "Annotations" / seq).glob("*.png")))
        if not n_img or n_img != n_ann:
            raise RuntimeError(f"{seq}: {n_img} frames but {n_ann} annotations after extraction")
        (cache / ".done" / seq).write_text(f"{n_img}\n")
    return todo


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Extract the DAVIS-2016 dev split (40 sequences) from a git mirror."
    )
    ap.add_argument("--git-dir", required=True, type=Path, help="the KNN-project repository's git directory")
    ap.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help=f"output folder (default {DEFAULT_CACHE})"
    )
    ap.add_argument("--commit", default=COMMIT)
    ap.add_argument("seqs", nargs="*", help="a subset of the dev split (default: all 40)")
    args = ap.parse_args(argv)
    try:
        done = extract(args.git_dir, args.cache.expanduser(), args.seqs or None, args.commit)
    except (ValueError, RuntimeError) as exc:
        print(f"davis_data: {exc}", file=sys.stderr)
        return 2
    print(
        f"{len(done)} sequences extracted into {args.cache} "
        f"({len(args.seqs or DEV_SPLIT) - len(done)} already there)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
