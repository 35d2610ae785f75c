"""`mono qualify` end to end on the host backend: 2 ranks as processes, Triton interpreter.

Each test runs the command in a subprocess, as a user would, and reads its JSON.
"""

import json
import os
import subprocess
import sys
import time

import pytest

QUALIFY_BUDGET_S = 180  # the bound, for an otherwise idle 2-core machine


def _budget() -> tuple[float, str]:
    """The bound, stretched by how busy the machine already is (CI is idle; a shared dev box
    running other suites is not), with the reason for the assertion message."""
    cores = os.cpu_count() or 1
    busy = max(1.0, min(3.0, os.getloadavg()[0] / cores))
    return QUALIFY_BUDGET_S * busy, f"{QUALIFY_BUDGET_S} s x {busy:.1f} (load / cores)"


def _qualify(
    tmp_path, *extra: str, timeout: float = 230
) -> tuple[subprocess.CompletedProcess, dict, float]:
    path = tmp_path / "qualify.json"
    began = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "mono_tools.cli", "qualify", "--json", str(path), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    seconds = time.monotonic() - began
    data = json.loads(path.read_text()) if path.exists() else {}
    return out, data, seconds


UNCHECKED = ("absent", "not run", "not checked")  # words of a build this machine did not check


def _assert_honest(data: dict) -> None:
    """A PASS row names only what was checked here; every build a rank reported absent has a
    SKIP row of its own, with the reason."""
    rows = {c["name"]: c for c in data["checks"]}
    for check in data["checks"]:
        if check["status"] == "pass":
            assert not any(w in check["detail"] for w in UNCHECKED), check
        for per_rank in check["per_rank"]:
            for label, why in per_rank.get("info", {}).get("absent", {}).items():
                row = rows.get(f"{check['name']}: {label}")
                assert row and row["status"] == "skip" and row["detail"] == why, (label, rows)


def _check(name, status, detail, absent=None):
    info = {"absent": absent} if absent else {}
    return {"name": name, "status": status, "detail": detail, "per_rank": [{"info": info}]}


def test_the_honesty_check_catches_a_pass_row_that_reports_an_absent_build():
    why = {"FFN flydsl gfx950": "absent: no ld.lld"}
    dishonest = [
        [_check("kernel builds", "pass", "K1 ok; FFN flydsl gfx950 absent (no ld.lld)")],
        [_check("kernel builds", "pass", "K1 ok", why)],  # absent, but no SKIP row
        [
            _check("kernel builds", "pass", "K1 ok", why),
            _check("kernel builds: FFN flydsl gfx950", "pass", "absent: no ld.lld"),
        ],
    ]
    for checks in dishonest:
        with pytest.raises(AssertionError):
            _assert_honest({"checks": checks})
    _assert_honest(
        {
            "checks": [
                _check("kernel builds", "pass", "K1 ok", why),
                _check("kernel builds: FFN flydsl gfx950", "skip", "absent: no ld.lld"),
            ]
        }
    )


@pytest.mark.timeout(560)
def test_qualify_passes_on_the_host_backend(tmp_path):
    budget, why = _budget()
    out, data, seconds = _qualify(tmp_path, "--ranks", "2", "--backend", "host", timeout=550)
    assert out.returncode == 0, out.stdout + out.stderr
    assert seconds < budget, f"qualify took {seconds:.0f} s, budget {why}"
    assert data["passed"] is True and data["ranks"] == 2 and data["backend"] == "host"
    statuses = {c["name"]: c["status"] for c in data["checks"]}
    assert set(statuses.values()) <= {"pass", "skip"}, statuses
    assert statuses["peer memory"] == "pass"
    _assert_honest(data)
    for check in data["checks"][1:]:  # every rank answered every check that ran
        if check["status"] == "pass":
            assert [r["rank"] for r in check["per_rank"]] == [0, 1], check["name"]
    assert "qualify: PASS" in out.stdout
    assert "check" in out.stdout and "result" in out.stdout  # the table


@pytest.mark.timeout(200)
def test_a_forced_fault_fails_the_run(tmp_path):
    out, data, _ = _qualify(
        tmp_path,
        "--ranks",
        "2",
        "--backend",
        "host",
        "--only",
        "ranks,tagged all-reduce",
        "--testing-force-fault",
        timeout=190,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    check = next(c for c in data["checks"] if c["name"] == "tagged all-reduce")
    assert check["status"] == "fail"
    assert [r["status"] for r in check["per_rank"]] == ["fail", "fail"]  # every rank reports
    assert all("MonoFault" in r["detail"] for r in check["per_rank"])
    assert "qualify: FAIL" in out.stdout
