"""K2's Triton build compiled ahead of time, without a GPU, for sm_90 and gfx950 (in child
processes, one a target: a backend abort would take pytest down)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from mono_peer.testing import spawn


def _load(name):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ranks = _load("k2_ranks")


@pytest.mark.timeout(300)
def test_compiles_for_sm90_and_gfx950():
    sm90, gfx950 = spawn(ranks.compile_checks, 2, 280, 2, 2, env={"TRITON_INTERPRET": "0"})
    facts = sm90 | gfx950
    assert facts["sys_value_store"], "peer pairs are not 64-bit relaxed stores at sys scope"
    assert facts["sys_release_xchg"], "the handshake is not a 64-bit release exchange at sys scope"
    assert facts["gpu_acquire"], "waits on other programs' items have no gpu-scope acquire"
    assert facts["globaltimer"], "the bounded waits do not read %globaltimer"
    assert facts["spills"] == 0, f"sm_90 build spills {facts['spills']} bytes"
    assert facts["residency"] is None, facts["residency"]
    assert facts["split_draws"] == [], (
        f"scalar atomics reach their broadcast barrier with warp 0 split: {facts['split_draws']}"
    )
    assert not any(facts["narrow_stream_loads"]), (
        f"dot loops load global memory 1-2 bytes at a time: {facts['narrow_stream_loads']}"
    )
    assert facts["hip_atomics"], "gfx950 build has no global atomics"
    assert facts["hip_clock"], "gfx950 waits do not read s_memrealtime"
