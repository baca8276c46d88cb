"""Run simulated histories: ``python -m tests.sim.run --seed S | --histories N | --minutes M``.

``--seed S`` replays one history and prints its steps; ``--histories N`` runs seeds
``--first`` .. ``--first + N - 1``; ``--minutes M`` explores from a random first seed until
M minutes have passed. A history that breaks an invariant prints its seed and steps, and
the run exits with status 1. The last line says how many histories ran and that no invariant
broke, or the first that did. ``--mutant NAME`` runs a deliberately broken variant
(``tests/sim/mutants.py``): then the run is expected to fail.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

from django_redlock.procedures import flow
from tests.sim import faults, mutants
from tests.sim.world import PROFILES, World, draw_config


@contextlib.contextmanager
def seeded_tokens(rng: random.Random) -> Iterator[None]:
    """Lease tokens from the history's generator instead of ``secrets``: the same seed
    makes the same tokens, so the same history."""
    namespace = vars(flow)
    saved = namespace["secrets"]
    namespace["secrets"] = SimpleNamespace(
        token_hex=lambda n: rng.getrandbits(8 * n).to_bytes(n, "big").hex()
    )
    try:
        yield
    finally:
        namespace["secrets"] = saved


@dataclass
class Outcome:
    seed: int
    world: World

    @property
    def dropped(self) -> frozenset[int]:
        return self.world.dropped

    @property
    def violations(self) -> list[str]:
        return self.world.checker.violations

    @property
    def expected(self) -> bool:
        """Every violation is excused by a fault outside the model (a stale write never is)."""
        checker = self.world.checker
        return bool(checker.expected) and not checker.defects

    def report(self) -> str:
        checker = self.world.checker
        config = self.world.config
        head = [
            f"seed {self.seed}: {len(checker.violations)} violation(s)"
            + (f" (expected: {', '.join(sorted(checker.expected))})" if checker.expected else ""),
            f"config: {config}",
        ]
        if self.dropped:
            head.append(f"shrunk: planned faults {sorted(self.dropped)} left out")
        return "\n".join([*head, self.world.history(), *checker.violations])


def simulate(
    seed: int,
    mutant: str | None = None,
    *,
    outside_model: bool = False,
    profile: str = "mix",
    dropped: frozenset[int] = frozenset(),
) -> Outcome:
    """Run the history of ``seed`` (under ``mutant``, if named); never raises on a violation.
    ``outside_model``: add the fault classes whose violations are expected (node clock jumps
    beyond the drift bound, declare_fresh at the wrong moment)."""
    rng = random.Random(seed)
    config = draw_config(
        rng, clock_jumps=outside_model, operator_errors=outside_model, profile=profile
    )
    with mutants.applied(mutant) as overrides, seeded_tokens(random.Random(seed ^ 0x5EED)):
        world = World(seed, config, overrides, dropped)
        world.run()
    return Outcome(seed, world)


def shrink(
    outcome: Outcome,
    mutant: str | None = None,
    *,
    outside_model: bool = False,
    profile: str = "mix",
) -> Outcome:
    """A failing history with as few of its planned faults as still break an invariant:
    drop each fault in turn and keep it dropped if the history still fails (the rest of the
    history may change with it: it is a new history of the same seed, and it is replayed
    with the same ``dropped`` set)."""
    planned = len(faults.plan(outcome.world))
    best = outcome
    for index in range(planned):
        dropped = best.dropped | {index}
        trial = simulate(
            outcome.seed, mutant, outside_model=outside_model, profile=profile, dropped=dropped
        )
        if trial.violations and not trial.expected:
            best = trial
    return best


@dataclass
class Exploration:
    """Histories run (``count``), their simulated and real seconds, how many broke an
    invariant under a fault outside the model (``expected``, by reason), and the first that
    broke one otherwise (``failure``)."""

    count: int = 0
    simulated: float = 0.0
    real: float = 0.0
    faults: int = 0
    steps: int = 0
    expected: dict[str, int] = field(default_factory=dict)
    failure: Outcome | None = None

    def figures(self) -> str:
        return (
            f"{self.count} histories: {self.simulated:.0f} simulated seconds in {self.real:.1f} s "
            f"({self.count / self.real:.1f} histories/s, "
            f"{self.simulated / self.real:.0f} simulated s per real s); "
            f"{self.faults} planned faults, {self.steps} steps "
            f"({self.steps / self.real:,.0f} steps/s)"
        )


def explore(
    seeds: Iterator[int],
    mutant: str | None = None,
    *,
    outside_model: bool = False,
    profile: str = "mix",
) -> Exploration:
    """Run histories until one breaks an invariant (an expected break is counted and
    skipped)."""
    found = Exploration()
    began = time.perf_counter()
    for seed in seeds:
        outcome = simulate(seed, mutant, outside_model=outside_model, profile=profile)
        found.count += 1
        found.simulated += outcome.world.now
        found.faults += outcome.world.faults
        found.steps += outcome.world.steps
        if outcome.violations and outcome.expected:
            for reason in outcome.world.checker.expected:
                found.expected[reason] = found.expected.get(reason, 0) + 1
        elif outcome.violations:
            found.failure = outcome
            break
    found.real = time.perf_counter() - began
    return found


def replay(options: argparse.Namespace, outcome: Outcome) -> str:
    """The command that replays ``outcome``."""
    return (
        f"./run sim --seed {outcome.seed}"
        + (f" --mutant {options.mutant}" if options.mutant else "")
        + (f" --profile {options.profile}" if options.profile != "mix" else "")
        + (" --outside-model" if options.outside_model else "")
        + (f" --drop {','.join(map(str, sorted(outcome.dropped)))}" if outcome.dropped else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run sim", description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--seed", type=int, help="replay one history and print its steps")
    what.add_argument("--histories", type=int, help="run this many histories")
    what.add_argument("--minutes", type=float, help="explore for this many minutes")
    parser.add_argument("--first", type=int, default=None, help="the first seed (default: random)")
    parser.add_argument("--mutant", choices=sorted(mutants.MUTANTS), help="a broken variant")
    parser.add_argument(
        "--outside-model",
        action="store_true",
        help="add clock jumps and a wrong declare_fresh (their violations are expected)",
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="mix",
        # argparse %-formats help texts: a "%" of a profile's text must be written "%%".
        help="; ".join(f"{name}: {text}" for name, text in PROFILES.items()).replace("%", "%%"),
    )
    parser.add_argument(
        "--shrink", action="store_true", help="with --seed: leave out every fault it can"
    )
    parser.add_argument("--drop", help="with --seed: the planned faults to leave out (1,4,7)")
    options = parser.parse_args(argv)
    if options.seed is not None:
        dropped = frozenset(int(i) for i in options.drop.split(",") if i) if options.drop else None
        outcome = simulate(
            options.seed,
            options.mutant,
            outside_model=options.outside_model,
            profile=options.profile,
            dropped=dropped or frozenset(),
        )
        failed = bool(outcome.violations) and not outcome.expected
        if failed and options.shrink:
            outcome = shrink(
                outcome,
                options.mutant,
                outside_model=options.outside_model,
                profile=options.profile,
            )
        print(outcome.report())
        if failed and outcome.dropped:
            print(f"\nreplay: {replay(options, outcome)}")
        print(verdict(1, outcome if failed else None, expected(outcome), options.mutant))
        return 1 if failed else 0
    first = options.first if options.first is not None else random.SystemRandom().randrange(2**32)
    if options.minutes is not None:
        stop = time.monotonic() + options.minutes * 60

        def seeds() -> Iterator[int]:
            seed = first
            while time.monotonic() < stop:
                yield seed
                seed += 1

        chosen: Iterator[int] = seeds()
    else:
        chosen = iter(range(first, first + (options.histories or 1000)))
    found = explore(
        chosen, options.mutant, outside_model=options.outside_model, profile=options.profile
    )
    print(f"from seed {first}, {found.figures()}")
    for reason, count in sorted(found.expected.items()):
        print(f"{count} histories broke an invariant after {reason} (expected)")
    failure = found.failure
    if failure is not None:
        print(failure.report())
        print(f"\nreplay: {replay(options, failure)}  (add --shrink: fewer faults)")
    print(verdict(found.count, failure, found.expected, options.mutant))
    return 1 if failure is not None else 0


def expected(outcome: Outcome) -> dict[str, int]:
    """The faults outside the model after which ``outcome`` broke an invariant, as excused."""
    if outcome.violations and outcome.expected:
        return dict.fromkeys(outcome.world.checker.expected, 1)
    return {}


def verdict(
    count: int, failure: Outcome | None, excused: dict[str, int], mutant: str | None
) -> str:
    """The run's last line: how many histories ran, and that no invariant broke or which
    did (the first violation of the failing history)."""
    ran = f"{count} histor{'y' if count == 1 else 'ies'} ran"
    if failure is not None:
        caught = f" (mutant {mutant}: caught, as expected)" if mutant else ""
        return (
            f"FAILED: {ran}; seed {failure.seed} broke an invariant{caught}: "
            f"{failure.violations[0]}"
        )
    if excused:
        after = ", ".join(f"{n} after {reason}" for reason, n in sorted(excused.items()))
        return (
            f"OK: {ran}; no invariant broke but after faults outside the model ({after}: expected)"
        )
    return f"OK: {ran}; no invariant broke" + (f" (mutant {mutant} survived)" if mutant else "")


if __name__ == "__main__":
    sys.exit(main())
