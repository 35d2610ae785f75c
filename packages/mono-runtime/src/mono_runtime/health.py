"""Decode a rank's health words and alarm words into a timeline a person can act on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import protocol as P


@dataclass(frozen=True)
class GiveUp:
    """One recorded give-up of one program (PROTOCOL.md, health record)."""

    kind: int
    region: int
    pair: int
    wanted: P.Tag
    seen: P.Tag
    program: int
    time: int
    alarms: tuple[int, ...]  # ranks whose alarm word was set at the give-up

    @property
    def complete(self) -> bool:
        return self.kind != 0


def decode(words: Sequence[int]) -> tuple[int, list[GiveUp]]:
    """(give-ups counted, the records written) from a rank's HEALTH_WORDS int64 words."""
    if len(words) < P.HEALTH_WORDS:
        raise ValueError(f"health: {len(words)} words, need {P.HEALTH_WORDS}")
    count = int(words[P.H_GIVEUPS])
    records = []
    for k in range(min(count, P.RECORDS)):
        w = [int(x) for x in words[P.HEALTH_HEAD + k * P.RECORD_WORDS :][: P.RECORD_WORDS]]
        bits = w[P.R_ALARMS] & ((1 << 64) - 1)
        records.append(
            GiveUp(
                kind=w[P.R_KIND],
                region=w[P.R_REGION],
                pair=w[P.R_PAIR],
                wanted=P.decode_tag(w[P.R_WANTED]),
                seen=P.decode_tag(w[P.R_SEEN]),
                program=w[P.R_PROGRAM],
                time=w[P.R_TIME],
                alarms=tuple(r for r in range(64) if bits >> r & 1),
            )
        )
    return count, records


def _alarm_summary(alarm_words: Sequence[int]) -> str:
    names = {P.ALARM_GAVE_UP: "gave up", P.ALARM_FOLLOWED: "followed"}
    parts = [
        f"rank {r} {names.get(int(a), f'alarm {int(a)}')}"
        for r, a in enumerate(alarm_words)
        if int(a)
    ]
    return ", ".join(parts) if parts else "none set"


def _verdict(g: GiveUp, writer: int | None) -> str:
    who = f"rank {writer}" if writer is not None else "the writer"
    if g.kind == P.KIND_ERA:
        return (
            "the step is outside its tag era: the runner missed its rezero "
            "(after_step must run once per step)"
        )
    if g.kind == P.KIND_ALARM:
        ranks = ", ".join(str(r) for r in g.alarms) or "?"
        return f"stopped because rank(s) {ranks} had raised an alarm"
    if not g.seen.valid:
        return f"{who} never arrived at {g.wanted} (nothing written there since the last rezero)"
    if (g.seen.step, g.seen.slot) < (g.wanted.step, g.wanted.slot):
        if g.seen.step == g.wanted.step:
            return f"{who} never arrived at {g.wanted} (it got as far as slot {g.seen.slot})"
        behind = g.wanted.step - g.seen.step
        return f"{who} never arrived at {g.wanted} (its last pair here is {behind} step(s) old)"
    return f"{who} is ahead ({g.seen}): the ranks disagree on the step's launches"


def timeline(rank: int, words: Sequence[int], alarm_words: Sequence[int], unit: str) -> str:
    """The text MonoFault carries: which program waited for what, what it saw, and who is
    to blame, ordered by time (`unit`: "ns" on a GPU, "polls" under the interpreter)."""
    count, records = decode(words)
    lines = [
        f"mono: rank {rank} stopped in-kernel waits ({count} give-up(s)); "
        f"alarms here: {_alarm_summary(alarm_words)}"
    ]
    done = sorted((g for g in records if g.complete), key=lambda g: g.time)
    t0 = done[0].time if done else 0
    for g in done:
        where, writer = P.describe_pair(g.region, g.pair)
        lines.append(
            f"  +{g.time - t0} {unit}  rank {rank} program {g.program}: "
            f"{P.KIND_NAMES.get(g.kind, g.kind)} at {P.region_name(g.region)} {where}: "
            f"wanted {g.wanted}, saw {g.seen} -> {_verdict(g, writer)}"
        )
    if len(done) < len(records):
        lines.append(f"  ({len(records) - len(done)} record(s) still being written)")
    if count > P.RECORDS:
        lines.append(f"  ({count - P.RECORDS} later give-up(s) not recorded)")
    return "\n".join(lines)
