"""Cross-validated DAVIS figures: parameters chosen on three folds of the dev split, reported on the fourth.

A tuned figure measured on the sequences it was tuned on is optimistic.  This script takes the per-sequence results
of several candidate configurations -- one ``bench_davis.py --trackers new --json FILE`` run each, with its own
``--param`` settings -- and, for each fold of ``davis_data.FOLDS`` in turn, chooses the candidate that scores best on
the other three folds and takes its results on the held-out fold.  Every sequence is held out exactly once, so the
cross-validated figure is a mean over all 40 sequences of results that did not choose themselves::

    python benchmarks/bench_davis.py --trackers new --seeds 3 --json cv/base.json
    python benchmarks/bench_davis.py --trackers new --seeds 3 --param area_grow_rate=0.05 --json cv/grow05.json
    python benchmarks/davis_cv.py cv/*.json [--json cv/summary.json]

The choice maximises the mean J over the prompt modes present (ties: the lower wrong-object rate), one candidate
for all modes, as one set of defaults serves every prompt.  With a single candidate there is nothing to choose and
the cross-validated figure equals the all-dev one.  A change that raises the all-dev figure but not the
cross-validated one is not an improvement (issue 27).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from davis_data import DEV_SPLIT, FOLDS

Results = dict[str, dict[str, dict[str, Any]]]  # mode -> sequence -> {"J": ..., "wrong": ..., ...}


def load_candidate(path: Path, tracker: str = "new") -> Results:
    """The per-sequence results of ``tracker`` in a ``bench_davis.py --json`` file; every dev sequence must be there
    (a partial run cannot be cross-validated)."""
    data = json.loads(path.read_text())
    per = data["per_sequence"].get(tracker)
    if per is None:
        raise SystemExit(f"davis_cv: {path} has no results of tracker {tracker!r}")
    for mode, seqs in per.items():
        missing = sorted(set(DEV_SPLIT) - set(seqs))
        if missing:
            raise SystemExit(
                f"davis_cv: {path} ({mode}) lacks {len(missing)} dev sequences, e.g. {missing[0]}"
            )
    return per


def score(results: Results, seqs: tuple[str, ...] | list[str]) -> tuple[float, float]:
    """(mean J over the modes, mean wrong-object rate over the modes) on ``seqs``: the selection objective."""
    modes = sorted(results)
    j = sum(sum(results[m][s]["J"] for s in seqs) / len(seqs) for m in modes) / len(modes)
    w = sum(sum(results[m][s]["wrong"] for s in seqs) / len(seqs) for m in modes) / len(modes)
    return j, w


def best(candidates: dict[str, Results], seqs: list[str]) -> str:
    """The candidate with the highest mean J on ``seqs`` (ties: lower wrong rate, then name)."""
    return min(
        candidates,
        key=lambda name: (-score(candidates[name], seqs)[0], score(candidates[name], seqs)[1], name),
    )


def cross_validate(candidates: dict[str, Results]) -> dict[str, Any]:
    """Per fold the chosen candidate; per mode the cross-validated J and wrong rate (every sequence held out once),
    and the all-dev figures of the candidate that is best on all 40."""
    modes = sorted(next(iter(candidates.values())))
    held: dict[str, dict[str, dict[str, float]]] = {m: {} for m in modes}
    chosen = []
    for k, fold in enumerate(FOLDS):
        train = [s for s in DEV_SPLIT if s not in fold]
        name = best(candidates, train)
        chosen.append({"fold": k, "chosen": name, "train_J": score(candidates[name], train)[0]})
        for m in modes:
            for s in fold:
                held[m][s] = candidates[name][m][s]
    all_dev = best(candidates, list(DEV_SPLIT))
    out: dict[str, Any] = {"folds": chosen, "all_dev_choice": all_dev, "modes": {}}
    for m in modes:
        cv_j = sum(r["J"] for r in held[m].values()) / len(held[m])
        cv_w = sum(r["wrong"] for r in held[m].values()) / len(held[m])
        dev = candidates[all_dev][m]
        out["modes"][m] = {
            "cv_J": cv_j,
            "cv_wrong": cv_w,
            "all_dev_J": sum(r["J"] for r in dev.values()) / len(dev),
            "all_dev_wrong": sum(r["wrong"] for r in dev.values()) / len(dev),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path, help="bench_davis.py --json files, one per candidate")
    ap.add_argument("--tracker", default="new", help="which tracker's results in each file (default new)")
    ap.add_argument("--json", type=Path, help="write the summary here")
    args = ap.parse_args(argv)
    candidates = {p.stem: load_candidate(p, args.tracker) for p in args.results}
    if len(candidates) != len(args.results):
        ap.error("two candidate files share a name (the file name, without .json, names the candidate)")
    modes = {tuple(sorted(c)) for c in candidates.values()}
    if len(modes) != 1:
        ap.error("the candidates were run with different --modes")
    out = cross_validate(candidates)
    for f in out["folds"]:
        print(f"fold {f['fold']}: chose {f['chosen']} (J {f['train_J']:.3f} on the other three folds)")
    print(
        f"\n{'mode':<7}{'CV J':>7}{'CV wrong':>10}{'all-dev J':>11}{'all-dev wrong':>15}   (all-dev: {out['all_dev_choice']})"
    )
    for m, r in out["modes"].items():
        print(
            f"{m:<7}{r['cv_J']:>7.3f}{r['cv_wrong']:>10.3f}{r['all_dev_J']:>11.3f}{r['all_dev_wrong']:>15.3f}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
