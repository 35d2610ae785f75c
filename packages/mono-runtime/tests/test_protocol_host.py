"""Tag arithmetic, pair packing and health decoding with its timeline (pure Python)."""

from __future__ import annotations

import itertools

import pytest
from mono_runtime import protocol as P
from mono_runtime.health import decode, timeline


def test_tags_are_injective_within_an_era_and_never_zero():
    steps = [1, 2, 3, P.ERA_STEPS // 2, P.ERA_STEPS - 1, P.ERA_STEPS]
    tags = [
        P.tag_of(base + s, base, slot)
        for base in (0, 2**31 - 1, 2**40)
        for s in steps
        for slot in (0, 1, 254, 255)
    ]
    per_base = len(tags) // 3
    for chunk in range(3):
        block = tags[chunk * per_base : (chunk + 1) * per_base]
        assert len(set(block)) == len(block) and min(block) > 0 and max(block) < 2**32
    assert P.tag_of(P.ERA_STEPS, 0, 255) == 2**32 - 1


def test_tags_outside_the_era_are_invalid():
    assert P.tag_of(5, 5, 0) == P.TAG_INVALID  # before the first step_begin
    assert P.tag_of(P.ERA_STEPS + 1, 0, 0) == P.TAG_INVALID
    assert P.tag_of(3, 9, 0) == P.TAG_INVALID
    with pytest.raises(ValueError, match="slot 256"):
        P.tag_of(1, 0, 256)


def test_decode_and_pairs_round_trip():
    for step, slot in itertools.product((1, 77, P.ERA_STEPS), (0, 3, 255)):
        tag = P.tag_of(step, 0, slot)
        assert P.decode_tag(tag) == P.Tag(step, slot)
        for payload in (0, 1, 0x7FC07FC0, 0xFFFFFFFF, 0x80000000):
            word = P.pack_pair(tag, payload)
            assert -(2**63) <= word < 2**63
            assert P.unpack_pair(word) == (tag, payload)
    assert not P.decode_tag(0).valid and str(P.decode_tag(0)) == "nothing (zeroed)"


def test_region_ids_are_stable_and_describe_pairs():
    rid = P.region_id("test.rows", lambda pair: (f"from rank {pair // 4}", pair // 4))
    assert rid == P.region_id("test.rows")  # the same name, the same id, any process
    assert 0 < rid < 2**31 and P.region_name(rid) == "test.rows"
    P.region_id("test.rows", lambda pair: (f"from rank {pair // 4}", pair // 4))
    assert P.describe_pair(rid, 9) == ("pair 9 (from rank 2)", 2)
    assert P.describe_pair(12345, 3) == ("pair 3", None)


def _health(*records):
    words = [0] * P.HEALTH_WORDS
    words[P.H_GIVEUPS] = len(records)
    for k, rec in enumerate(records):
        base = P.HEALTH_HEAD + k * P.RECORD_WORDS
        words[base : base + P.RECORD_WORDS] = rec
    return words


def test_timeline_names_who_never_arrived():
    rid = P.region_id("layer7.reduce", lambda pair: (f"from rank {pair // 10}", pair // 10))
    wanted = P.tag_of(12, 0, 7)
    words = _health(
        [P.KIND_DEADLINE, rid, 23, wanted, P.tag_of(11, 0, 7), 5, 1_000_900, 0],
        [P.KIND_ALARM, rid, 3, wanted, wanted, 2, 1_000_000, 0b101],
        [P.KIND_DEADLINE, rid, 24, wanted, P.tag_of(12, 0, 3), 6, 1_001_000, 0],
        [P.KIND_DEADLINE, rid, 25, wanted, 0, 7, 1_002_000, 0],
    )
    count, records = decode(words)
    assert count == 4 and records[1].alarms == (0, 2)
    text = timeline(1, words, [0, 2, 1], "ns")
    lines = text.splitlines()
    assert lines[0].startswith("mono: rank 1 stopped in-kernel waits (4 give-up(s))")
    assert "alarms here: rank 1 gave up, rank 2 followed" in lines[0]
    assert lines[1].startswith("  +0 ns  rank 1 program 2: alarm at layer7.reduce")
    assert "stopped because rank(s) 0, 2 had raised an alarm" in lines[1]
    assert "+900 ns  rank 1 program 5: deadline at layer7.reduce pair 23 (from rank 2)" in text
    assert (
        "wanted step 12 slot 7, saw step 11 slot 7 -> rank 2 never arrived at step 12 "
        "slot 7 (its last pair here is 1 step(s) old)" in text
    )
    assert "(it got as far as slot 3)" in text
    assert "nothing written there since the last rezero" in text


def test_timeline_incomplete_and_overflow_and_era():
    rec = [0, 1, 0, 5, 0, 0, 0, 0]  # KIND not yet written
    words = _health(*([rec] * P.RECORDS))
    words[P.H_GIVEUPS] = P.RECORDS + 3
    text = timeline(0, words, [0], "polls")
    assert f"({P.RECORDS} record(s) still being written)" in text
    assert "(3 later give-up(s) not recorded)" in text
    era = timeline(0, _health([P.KIND_ERA, 1, 0, 0, 0, 0, 0, 0]), [2], "polls")
    assert "outside its tag era" in era
    with pytest.raises(ValueError, match="health"):
        decode([0] * 3)


def test_poll_backoff_comes_from_the_environment_and_is_checked(monkeypatch):
    monkeypatch.delenv(P.POLL_BACKOFF_ENV, raising=False)
    assert P.poll_backoff() == (0, 0)
    for raw, want in (("250", (250, 0)), ("200:2000", (200, 2000)), ("0:500", (0, 0))):
        monkeypatch.setenv(P.POLL_BACKOFF_ENV, raw)
        assert P.poll_backoff() == want
    for bad in ("-5", "1e3", "fast", str(P.POLL_BACKOFF_MAX_NS + 1), "1:2:3", "100:", ":100"):
        monkeypatch.setenv(P.POLL_BACKOFF_ENV, bad)
        with pytest.raises(ValueError, match=P.POLL_BACKOFF_ENV):
            P.poll_backoff()


def test_publish_way_comes_from_the_environment_and_is_checked(monkeypatch):
    monkeypatch.delenv(P.PUBLISH_ENV, raising=False)
    assert P.publish_way() == "store"
    monkeypatch.setenv(P.PUBLISH_ENV, "xchg")
    assert P.publish_way() == "xchg"
    monkeypatch.setenv(P.PUBLISH_ENV, "release")
    with pytest.raises(ValueError, match=P.PUBLISH_ENV):
        P.publish_way()
