"""The long fuzz run of the swap engine: thousands of random programs and swap sets.

    python tools/fuzz.py --programs 10000 [--seed N] [--jobs 2] [--exclude FEATURE]
    python tools/fuzz.py --replay "Case(...)"      # one case again, as printed by a failure

Each job runs hypothesis over ``tests/helpers/fuzzing.py``'s ``cases()`` strategy in its own process
(one torch thread each), with its own seed derived from ``--seed``: the same command explores
the same programs. Every drawn case is checked end to end (``fuzzing.check_case``); a failure
is recorded and the run goes on. About one program in two that has an ``op(lin(x))`` module
is checked another way (feature ``custom_backward``): some of those modules are swapped for
replacements with a hand-written backward (a ``torch.autograd.Function``), right or with a
planted gradient error, and ``gs.verify(..., backward=True)`` must pass the right ones and call
the wrong ones a backward mismatch with the forward matching (``wrong_backward`` counts those). At the end it prints how many programs were tried, how many
calls were swapped, how many refusals were expected (and seen), the mismatches and the errors,
how many cases had each feature (and how many failing cases had it, which tells a failure that
comes with one situation from one that does not), then the first failing cases of each kind,
each as the model's pseudo-code, the swap set and a command that replays it. ``--exclude``
leaves out a situation the strategy can leave out (``fuzzing.EXCLUDABLE``: one an engine
defect was known in), to see what else fails. Exit status 1 when there is any mismatch or error.

The engine checked is this checkout's (its root comes first on the import path), whatever
else is installed.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import multiprocessing
import os
import re
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported, in every process

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402
from helpers import fuzzing  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis.errors import UnsatisfiedAssumption  # noqa: E402

from graphsurgeon.rewrite import _parts  # noqa: E402

# every part of a swapped program's code taken from the cache is also written afresh and
# compared, as in the tests (in each worker: they import this module)
_parts.CHECK_KEPT_PARTS = True

PROGRESS_SECONDS = 30
KEPT_PER_KIND = 3  # failing cases kept for each kind of failure


def failure_kind(error: BaseException) -> str:
    """A failure's kind, for grouping: its type and message with names and numbers blanked."""
    first_line = (str(error).strip().splitlines() or [""])[0]
    blanked = re.sub(r"'[^']*'", "'…'", first_line)
    blanked = re.sub(r"\d+(\.\d+)?", "N", blanked)
    return f"{type(error).__name__}: {blanked[:160]}"


class Tally:
    """What one job saw."""

    def __init__(self):
        self.programs = 0
        self.swaps = 0
        self.refusals = 0
        self.mismatches = 0
        self.errors = 0
        self.features: collections.Counter[str] = collections.Counter()
        # the features of the failing cases: a failure that every one of them shares with a
        # feature is likely that feature's
        self.failing_features: collections.Counter[str] = collections.Counter()
        self.kinds: collections.Counter[str] = collections.Counter()
        self.failures: list[dict] = []

    def record_failure(self, category: str, error: BaseException, case, where: str) -> None:
        if category == "mismatch":
            self.mismatches += 1
        else:
            self.errors += 1
        kind = failure_kind(error)
        self.kinds[kind] += 1
        if case is not None:
            found = fuzzing.features(case, fuzzing.analyze(case.program, case.second_input))
            self.features.update(found)
            self.failing_features.update(found)
        if self.kinds[kind] <= KEPT_PER_KIND:
            self.failures.append(
                {
                    "category": category,
                    "kind": kind,
                    "where": where,
                    "traceback": "".join(traceback.format_exception(error))[-3000:],
                    "description": fuzzing.describe(case) if case is not None else "",
                    "repr": repr(case) if case is not None else "",
                }
            )

    def merge(self, other: Tally) -> None:
        for name in ("programs", "swaps", "refusals", "mismatches", "errors"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.features.update(other.features)
        self.failing_features.update(other.failing_features)
        for kind, count in other.kinds.items():
            kept = sum(1 for f in self.failures if f["kind"] == kind)
            self.failures += [f for f in other.failures if f["kind"] == kind][
                : max(0, KEPT_PER_KIND - kept)
            ]
            self.kinds[kind] += count


def check_drawn(
    tally: Tally, examples: int, hypothesis_seed: int, label: str, report, exclude=()
) -> None:
    """Check ``examples`` cases drawn by hypothesis with ``hypothesis_seed`` into ``tally``,
    none with a feature in ``exclude``."""

    @seed(hypothesis_seed)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],  # a failure is recorded, not shrunk: the run goes on
        suppress_health_check=list(HealthCheck),
    )
    @given(case=fuzzing.cases(exclude=exclude))
    def check(case):
        where = f"{label}, hypothesis seed {hypothesis_seed}, program {tally.programs}"
        try:
            result = fuzzing.check_case(case)
        except UnsatisfiedAssumption:
            raise  # a draw that tests nothing: hypothesis draws another
        except fuzzing.Mismatch as error:
            tally.record_failure("mismatch", error, case, where)
        except Exception as error:
            tally.record_failure("error", error, case, where)
        else:
            tally.swaps += result.replaced_calls
            tally.refusals += result.refused
            tally.features.update(fuzzing.features(case, result.facts))
        tally.programs += 1
        report()

    check()


def run_job(job: int, programs: int, base_seed: int, exclude: tuple[str, ...] = ()) -> Tally:
    """Check ``programs`` drawn cases in this process; never raises for a failing case."""
    torch.set_num_threads(1)
    tally = Tally()
    started = last_report = time.monotonic()

    def report() -> None:
        nonlocal last_report
        now = time.monotonic()
        if now - last_report >= PROGRESS_SECONDS:
            last_report = now
            print(
                f"[job {job}] {tally.programs}/{programs} programs, {tally.swaps} swaps, "
                f"{tally.refusals} refusals, {tally.mismatches} mismatches, "
                f"{tally.errors} errors ({now - started:.0f} s)",
                flush=True,
            )

    # hypothesis may stop short of max_examples (too many draws rejected): go on with a new seed
    for round_ in itertools.count():
        before = tally.programs
        hypothesis_seed = base_seed * 1000 + job + 100_000 * round_
        try:
            label = f"job {job}"
            remaining = programs - tally.programs
            check_drawn(tally, remaining, hypothesis_seed, label, report, exclude)
        except Exception as error:  # the strategy itself failed: a generator bug, stop here
            tally.record_failure("error", error, None, f"job {job}, drawing a case")
            break
        if tally.programs >= programs or tally.programs == before:
            break
    return tally


def _job(arguments: tuple[int, int, int, tuple[str, ...]]) -> dict:
    # a plain dict crosses the process boundary: the class lives in a main module that the
    # parent and the workers import under different names
    return vars(run_job(*arguments))


def replay(text: str) -> int:
    """Check one case given as its repr (or a file holding it); print what happens."""
    if not text.lstrip().startswith("Case("):
        text = Path(text).read_text()
    case = eval(text, vars(fuzzing))  # the repr of a Case, as a failure prints it
    print(fuzzing.describe(case))
    try:
        result = fuzzing.check_case(case)
    except fuzzing.Unobservable as reason:
        print(f"tests nothing: {reason}")
        return 0
    except Exception:
        traceback.print_exc()
        return 1
    verdict = "refused, as it must be" if result.refused else "swapped: matches the reference"
    print(f"ok: {verdict} ({result.replaced_calls} calls replaced)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=10_000, help="programs to check")
    parser.add_argument("--seed", type=int, default=0, help="base seed of every job")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--replay", metavar="CASE", help="check one printed case again")
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        choices=sorted(fuzzing.EXCLUDABLE),
        help="leave a situation out of the programs (repeatable)",
    )
    options = parser.parse_args(argv)
    if options.replay is not None:
        return replay(options.replay)

    jobs = max(1, min(options.jobs, options.programs))
    shares = [options.programs // jobs + (j < options.programs % jobs) for j in range(jobs)]
    exclude = tuple(options.exclude)
    left_out = f", leaving out {', '.join(exclude)}" if exclude else ""
    print(
        f"fuzz: {options.programs} programs, {jobs} jobs, seed {options.seed}{left_out}",
        flush=True,
    )
    started = time.monotonic()
    work = [(j, shares[j], options.seed, exclude) for j in range(jobs)]
    if jobs == 1:
        tallies = [_job(work[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            tallies = pool.map(_job, work)
    total = Tally()
    for fields in tallies:
        tally = Tally()
        vars(tally).update(fields)
        total.merge(tally)
    elapsed = time.monotonic() - started

    per_program = elapsed * jobs / max(total.programs, 1)
    print(f"\nfuzz: done in {elapsed:.0f} s, {per_program:.3f} s a program in each job")
    print("cases with each feature (and failing cases with it):")
    for feature in (*fuzzing.FEATURES, *fuzzing.OUTCOMES):
        failing = total.failing_features[feature]
        print(f"  {feature:<22} {total.features[feature]:>6}  ({failing} failing)")
    print(f"programs tried:    {total.programs}")
    print(f"swaps tried:       {total.swaps} (calls replaced)")
    print(f"refusals expected: {total.refusals}")
    print(f"mismatches:        {total.mismatches}")
    print(f"errors:            {total.errors}")
    if total.kinds:
        print("\nfailures by kind:")
        for kind, count in total.kinds.most_common():
            print(f"  {count:>6}  {kind}")
    for number, failure in enumerate(total.failures, 1):
        print(f"\n== failure {number}: {failure['category']} ({failure['where']})")
        print(failure["kind"])
        if failure["description"]:
            print(failure["description"])
            print(f'replay: python tools/fuzz.py --replay "{failure["repr"]}"')
        print(failure["traceback"].rstrip())
    return 1 if total.mismatches or total.errors else 0


if __name__ == "__main__":
    sys.exit(main())
