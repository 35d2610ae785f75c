"""The kernel-builds check from the registry, without compiling a real kernel: what it
plans on a CPU (a job per build and target, a SKIP reason for each of the rest), a
compile child's abort or residency problem failing the check, and on a GPU a SKIP row for
every build the runner did not take. Toy builds stand in for the kernel packages'."""

from __future__ import annotations

import sys
import textwrap

import pytest
from mono_runtime.kernel import registry
from mono_tools import kernels
from mono_tools.bench.command import KERNELS
from mono_tools.qualify import builds
from mono_tools.qualify.context import CheckFailed, RankContext

TOYS = """
import os
from mono_runtime.kernel import Build, Compiled, KernelSpec
from mono_runtime.kernel.registry import register


class _Toy(Build):
    family, targets = "toy", ("sm90", "gfx950")
    spec = KernelSpec("toy", ())

    @classmethod
    def example(cls):
        return cls("toy")

    def supports(self, target):
        return None if target == "sm90" else "the toy serves sm90 only"

    def warm(self, programs, **args):
        pass

    def launch(self, programs, **args):
        pass


@register
class Aborts(_Toy):
    backend = "triton"

    def _compile(self, target):
        os.abort()  # what a backend does on an intrinsic the target lacks


@register
class TooBig(_Toy):
    backend = "flydsl"

    def compiler_missing(self):
        return os.environ.get("TOY_NO_LINKER")

    def _compile(self, target):
        return Compiled(target, 2048, problem="a grid of 256 cannot be resident")
"""


@pytest.fixture
def toys(tmp_path, monkeypatch):
    """The toy builds alone in the registry, their module importable by compile children."""
    (tmp_path / "mono_toy_builds.py").write_text(textwrap.dedent(TOYS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(registry, "_BUILDS", {})
    monkeypatch.setitem(sys.modules, "mono_toy_builds", None)  # imported afresh
    del sys.modules["mono_toy_builds"]
    monkeypatch.setattr(kernels, "BUILD_MODULES", ("mono_toy_builds", "mono_absent_pkg.build"))


def test_every_build_and_target_is_a_job_or_a_skip_with_its_reason(toys, monkeypatch):
    monkeypatch.setenv("TOY_NO_LINKER", "no ld.lld here")
    jobs, absent = builds._plan()
    assert [job.label for job in jobs] == ["toy triton sm90"]
    assert absent == {
        "mono_absent_pkg.build": "absent: mono_absent_pkg is not installed",
        "toy triton gfx950": "not checked: the toy serves sm90 only",
        "toy flydsl sm90": "not checked: no ld.lld here",
        "toy flydsl gfx950": "not checked: the toy serves sm90 only",
    }
    assert [[j.label for j in mine] for mine in builds.share(jobs * 3, 2)] == [
        ["toy triton sm90"] * 2,
        ["toy triton sm90"],
    ]


@pytest.mark.timeout(120)
def test_an_abort_or_a_residency_problem_fails_the_check_not_the_rank(toys):
    jobs, _ = builds._plan()
    running = [builds.Running(job) for job in jobs]  # both compile children at once
    for job, run in zip(jobs, running, strict=True):
        with pytest.raises(CheckFailed) as err:
            run.result()
        if job.build.backend == "triton":
            assert "toy triton sm90 does not compile" in str(err.value)
        else:
            assert str(err.value) == (
                "toy flydsl sm90 compiles but cannot run: a grid of 256 cannot be resident"
            )


def test_on_a_gpu_each_build_the_runner_did_not_take_is_a_skip_row(toys, monkeypatch):
    import mono_runtime.kernel as kernel_api

    kernels.load()
    monkeypatch.setattr(kernel_api, "target_name", lambda device: "sm90")
    monkeypatch.setattr(
        builds, "REFERENCE_CHECKS", {"toy": lambda ctx: ("toy matches", "toy flydsl")}
    )
    ctx = RankContext(0, 1, "cuda", "cuda:0", None)
    assert builds._run_on_gpu(ctx) == "toy matches"
    assert ctx.info["absent"] == {
        "mono_absent_pkg.build": "absent: mono_absent_pkg is not installed",
        "toy triton sm90": "not run: the runner takes toy flydsl here",
    }

    def not_here(ctx):
        raise builds.NotRun("it shards over (1, 2, 4, 8) ranks, not 3")

    monkeypatch.setattr(builds, "REFERENCE_CHECKS", {"toy": not_here})
    ctx = RankContext(0, 3, "cuda", "cuda:0", None)
    with pytest.raises(builds.Skipped, match="no kernel build checked"):
        builds._run_on_gpu(ctx)
    assert (
        ctx.info["absent"]["toy flydsl sm90"] == "not run: it shards over (1, 2, 4, 8) ranks, not 3"
    )


def test_every_registered_family_has_a_bench():
    kernels.load()
    benched = {k.family for k in KERNELS.values()}
    assert set(registry.families()) <= benched, "register a family's `mono bench` too"
