"""mono_runtime.kernel on a CPU: the argument spec names a bad argument, a Build refuses
what it does not serve with the reason before compiling, the registry and its compile
child, and LayerRunner's closed-state contract. Toy builds, nothing compiles."""

from __future__ import annotations

import json

import pytest
import torch
from mono_runtime.errors import MonoUnsupported
from mono_runtime.kernel import Arg, Build, Compiled, KernelSpec, LayerRunner, registry, target_name
from mono_runtime.kernel import build as build_module
from mono_runtime.kernel import compile as compile_child

SPEC = KernelSpec(
    "toy",
    (
        Arg("x", "*bf16", "bf16 [S, H] rows in"),
        Arg("scratch", "*", "any bytes"),
        Arg("slot", "i32", "the tag slot"),
        Arg("final", "i1", "ends the step"),
        Arg("eps", "fp32", "norm epsilon"),
        Arg("bundle", dict, "weights, unpacked by the build", layout="toy-k32"),
    ),
)


def _args(**over):
    args = dict(
        x=torch.zeros(2, 4, dtype=torch.bfloat16),
        scratch=torch.zeros(8, dtype=torch.uint8),
        slot=3,
        final=True,
        eps=1e-6,
        bundle={},
    )
    return {**args, **over}


def test_a_good_launch_passes():
    SPEC.check(_args())
    SPEC.check(_args(final=0, eps=1, scratch=torch.zeros(2)))


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"x": torch.zeros(2, 4)}, "argument 'x': expected *bf16, got a torch.float32 tensor"),
        ({"x": 3}, "argument 'x': expected a tensor (*bf16), got int"),
        ({"slot": True}, "argument 'slot': expected an int (i32), got bool"),
        ({"slot": 1.0}, "argument 'slot': expected an int (i32), got float"),
        ({"slot": 1 << 31}, "argument 'slot': 2147483648 does not fit i32"),
        ({"final": 2}, "argument 'final': expected a bool, got int"),
        ({"eps": "1e-6"}, "argument 'eps': expected a float, got str"),
        ({"bundle": []}, "argument 'bundle': expected dict, got list"),
        ({"extra": 1}, "unknown argument(s) ['extra']"),
    ],
)
def test_a_bad_argument_is_named(over, says):
    with pytest.raises(ValueError) as err:
        SPEC.check(_args(**over))
    assert str(err.value) == f"toy: {says}"


def test_a_missing_argument_is_named():
    args = _args()
    del args["eps"]
    with pytest.raises(ValueError, match=r"toy: missing \['eps'\]"):
        SPEC.check(args)


def test_a_spec_refuses_unknown_types_and_twice_declared_names():
    with pytest.raises(ValueError, match="unknown type '\\*bf17'"):
        Arg("x", "*bf17", "")
    with pytest.raises(ValueError, match=r"\['x'\] declared twice"):
        KernelSpec("toy", (Arg("x", "i32", ""), Arg("x", "i64", "")))
    assert SPEC.by_name["bundle"].layout == "toy-k32" and SPEC.names[0] == "x"


class Toy(Build):
    """Serves sm90 and sm100; compiles ahead of time for sm90 only."""

    family, backend, targets = "toy", "triton", ("sm90",)
    spec = SPEC
    missing: str | None = None
    compiled: list = []

    @classmethod
    def example(cls) -> Build:
        return cls(("toy", 4))

    def supports(self, target):
        return None if target in ("sm90", "sm100") else f"toy serves sm90 and sm100, not {target}"

    def compiler_missing(self):
        return self.missing

    def _compile(self, target):
        self.compiled.append(target)
        return Compiled(target, shared=1024, problem="grid too large")

    def warm(self, programs, **args):
        self.spec.check(args)

    def launch(self, programs, **args):
        self.spec.check(args)


def test_compile_for_refuses_before_compiling_and_says_why():
    toy, Toy.compiled = Toy.example(), []
    with pytest.raises(MonoUnsupported, match="toy triton gfx950: toy serves sm90 and sm100"):
        toy.compile_for("gfx950")
    with pytest.raises(MonoUnsupported, match="ahead of time for sm90 only"):
        toy.compile_for("sm100")  # served, but not compiled ahead of time
    toy.missing = "no ptxas here"
    with pytest.raises(MonoUnsupported, match="toy triton sm90: no ptxas here"):
        toy.compile_for("sm90")
    assert Toy.compiled == []
    toy.missing = None
    assert toy.compile_for("sm90") == Compiled("sm90", 1024, None, "grid too large")
    assert Toy.compiled == ["sm90"]


def test_builds_compare_by_class_and_key():
    assert Toy(("a", 1)) == Toy(("a", 1)) and len({Toy(("a", 1)), Toy(("a", 1))}) == 1
    assert Toy(("a", 1)) != Toy(("a", 2)) and Toy.name() == "toy triton"
    Toy.example().warm(4, **_args())
    Toy.warm_all([(Toy.example(), _args())], 4)
    with pytest.raises(ValueError, match="argument 'slot'"):
        Toy.warm_all([(Toy.example(), _args(slot=None))], 4)


@pytest.mark.parametrize(
    ("seen", "want"),
    [("interpreter", "interpreter"), ("cuda:90:32", "sm90"), ("hip:gfx950:64", "gfx950")],
)
def test_target_names(monkeypatch, seen, want):
    monkeypatch.setattr(build_module, "target_of", lambda device: seen)
    assert target_name("cuda:0") == want


def test_the_cpu_is_the_interpreter():
    assert target_name("cpu") == "interpreter"


@pytest.fixture
def empty_registry(monkeypatch):
    monkeypatch.setattr(registry, "_BUILDS", {})


def test_the_registry_keeps_builds_by_name_and_family(empty_registry):
    registry.register(Toy)
    registry.register(Toy)  # a module imported again registers its class again

    class Other(Toy):
        backend = "flydsl"

    registry.register(Other)
    assert registry.families() == ["toy"]
    assert registry.builds("toy") == [Toy, Other] and registry.builds("ffn") == []
    assert registry.get("toy flydsl") is Other
    with pytest.raises(KeyError, match="no build 'toy cuda' registered"):
        registry.get("toy cuda")

    class Toy2(Toy):  # noqa: N801 - a second class under a name taken
        pass

    with pytest.raises(ValueError, match="two builds named 'toy triton'"):
        registry.register(Toy2)
    with pytest.raises(TypeError, match="not a Build class"):
        registry.register(dict)


def test_load_names_an_absent_package_and_raises_on_a_broken_module(tmp_path, monkeypatch):
    assert registry.load(["mono_not_installed.kda.build"]) == {
        "mono_not_installed.kda.build": "mono_not_installed is not installed"
    }
    (tmp_path / "mono_broken_build.py").write_text("import mono_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="mono_no_such_dependency"):
        registry.load(["mono_broken_build"])


def test_the_compile_child_prints_what_the_build_compiled(empty_registry, capsys):
    registry.register(Toy)
    assert compile_child.main([__name__, "toy triton", "sm90"]) == 0
    facts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert facts == {"target": "sm90", "shared": 1024, "spills": None, "problem": "grid too large"}


class Recorder(LayerRunner):
    """A runner whose hooks record their calls."""

    _closed_why = "its buffers are freed"

    def __init__(self, fail: bool = False):
        self.calls = []
        if fail:
            raise RuntimeError("allocation failed")
        self._opened()

    def _step_begin(self):
        self.calls.append("step_begin")

    def _after_step(self):
        self.calls.append("after_step")

    def _reset(self):
        self.calls.append("reset")

    def _inject(self, rank, delay_ns):
        self.calls.append(("inject", rank, delay_ns))

    def _release(self):
        self.calls.append("release")


def test_a_layer_runner_runs_its_hooks_until_closed():
    with Recorder() as r:
        assert not r.closed
        r.step_begin()
        r.after_step()
        r.inject(1, 5)
        r.inject(None)
        r.reset()
    assert r.closed
    r.close()  # idempotent: released once
    assert r.calls == [
        "step_begin",
        "after_step",
        ("inject", 1, 5),
        ("inject", None, 0),
        "reset",
        "release",
    ]
    for call in (r.step_begin, r.after_step, r.reset, lambda: r.inject(None)):
        with pytest.raises(RuntimeError, match=r"Recorder is closed \(its buffers are freed\)"):
            call()
    assert r.calls[-1] == "release"


def test_a_runner_is_closed_until_built():
    class Half(Recorder):
        def __init__(self):
            self.calls = []  # never opened: its constructor did not finish

    with pytest.raises(RuntimeError, match="Half is closed"):
        Half().step_begin()
    with pytest.raises(TypeError, match="abstract"):
        LayerRunner()


def test_check_tensor_names_what_is_wrong():
    import torch
    from mono_runtime.kernel import check_tensor

    t = torch.zeros(2, 3, dtype=torch.bfloat16)
    check_tensor("x", t, (2, 3), torch.bfloat16, "cpu")
    for bad, says in (
        ((3.0, (2, 3), torch.bfloat16), "x: expected a tensor, got float"),
        ((t, (3, 2), torch.bfloat16), r"x: shape \(2, 3\), expected \(3, 2\)"),
        ((t, (2, 3), torch.float32), "x: dtype torch.bfloat16, expected torch.float32"),
        ((t.t(), (3, 2), torch.bfloat16), "x: must be contiguous"),
    ):
        with pytest.raises(ValueError, match=says):
            check_tensor("x", *bad)
    with pytest.raises(ValueError, match="x: on cpu, expected meta"):
        check_tensor("x", t, (2, 3), torch.bfloat16, "meta")


def test_same_device_fills_in_the_current_cuda_index(monkeypatch):
    """A runner built for "cuda" takes tensors on cuda:N, N the current device (the H200
    run's K2 failure: a plain `!=` refused its own weights)."""
    from mono_runtime.kernel import same_device

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert same_device("cuda", "cuda:1") and same_device("cuda:1", "cuda")
    assert not same_device("cuda", "cuda:0") and not same_device("cuda:0", "cuda:1")
    assert same_device("cpu", torch.device("cpu")) and not same_device("cpu", "cuda")


def test_tile_overrides_replace_named_tiles_and_refuse_the_rest(monkeypatch):
    from mono_runtime.kernel.tiles import tile_overrides

    tiles = {"bn": 64, "stages": 3}
    monkeypatch.delenv("MONO_X_TILES", raising=False)
    assert tile_overrides("MONO_X_TILES", tiles) == tiles
    monkeypatch.setenv("MONO_X_TILES", " stages=2, ")
    got = tile_overrides("MONO_X_TILES", tiles)
    assert got == {"bn": 64, "stages": 2} and tiles["stages"] == 3  # a copy
    for bad in ("warps=8", "bn=", "bn=-1", "bn"):
        monkeypatch.setenv("MONO_X_TILES", bad)
        with pytest.raises(ValueError, match=r"MONO_X_TILES=.*expected name=int items of \['bn'"):
            tile_overrides("MONO_X_TILES", tiles)


def test_check_tile_names_the_rule_a_tile_breaks():
    from mono_runtime.kernel.tiles import check_tile

    check_tile("K", "bn", 64, divides=384)
    check_tile("K", "stages", 3, least=1, most=8, pow2=False)
    cases = [
        (dict(value=8), ">= 16"),
        (dict(value=48), "a power of two"),
        (dict(value=256, divides=384), "dividing 384"),
        (dict(value=4, least=1, most=2), "<= 2"),
    ]
    for kwargs, says in cases:
        with pytest.raises(ValueError, match=f"K tiles: bn = {kwargs['value']}: expected .*{says}"):
            check_tile("K", "bn", **kwargs)
