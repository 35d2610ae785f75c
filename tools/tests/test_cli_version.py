from mono_tools.cli import main


def test_version_imports_every_package(capsys):
    assert main(["version"]) == 0
    out = capsys.readouterr().out
    for name in ("mono_peer", "mono_runtime", "mono_kernels_minimax", "mono_kernels_kimi"):
        assert name in out
