"""Mistakes a user can make end with one line on stderr and status 2, no traceback."""

import pytest
import torch
from mono_tools.cli import main

NO_GPU = not torch.cuda.is_available()


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("mono: error: ")
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["bench", "ffn", "--rows", "1,x"], "'1,x' is not a list of row counts"),
        (["bench", "ffn", "--rows", "0,2"], "each row count must be 1..1024"),
        (["bench", "ffn", "--rows", "2,2"], "appears twice"),
        (["bench", "ffn", "--rows", ""], "no row counts given"),
        (["bench", "nothing"], "invalid choice: 'nothing'"),
        (["bench", "ffn", "--format", "int3"], "invalid choice: 'int3'"),
        (["qualify", "--ranks", "two"], "invalid int value: 'two'"),
        (["qualify", "--ranks", "0"], "--ranks must be at least 1"),
        (["qualify", "--backend", "tpu"], "invalid choice: 'tpu'"),
        (["qualify", "--only", "peer,nonsense"], "unknown check(s)"),
        (["qualify", "--only", ""], "(none given)"),
        (["qualify", "--only", " , "], "(none given)"),
        (["qualify", "--backend", "host", "--ranks", "9"], "runs at most 8"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: command"),
    ],
)
def test_bad_arguments(capsys, argv, says):
    assert says in _error(capsys, argv)


def test_unwritable_json_path(capsys, tmp_path):
    line = _error(capsys, ["qualify", "--json", str(tmp_path / "missing" / "q.json")])
    assert "does not exist" in line
    line = _error(capsys, ["qualify", "--json", str(tmp_path)])
    assert "is a folder" in line


@pytest.mark.parametrize("path", ["/dev/full", "/proc/version"])
def test_a_json_file_that_takes_no_write_is_refused_before_any_check(capsys, path):
    line = _error(capsys, ["qualify", "--backend", "host", "--json", path])
    assert f"--json {path}: cannot write there" in line  # and no rank started, no PASS


@pytest.mark.skipif(not NO_GPU, reason="checks the machine without a GPU")
@pytest.mark.parametrize("kernel", ["ffn", "kda", "allreduce"])
def test_bench_without_gpu(capsys, kernel):
    line = _error(capsys, ["bench", kernel, "--rows", "1,2"])
    assert f"mono bench {kernel} needs an NVIDIA or AMD GPU" in line


@pytest.mark.skipif(not NO_GPU, reason="checks the machine without a GPU")
@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_backend_the_machine_lacks(capsys, backend):
    line = _error(capsys, ["qualify", "--backend", backend])
    assert f"backend '{backend}' needs a GPU" in line


def test_unwritable_out_folder(tmp_path):
    from mono_tools.errors import UsageError
    from mono_tools.outputs import out_folder

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="cannot write there"):
        out_folder(str(blocker / "sub"))
    assert out_folder(str(tmp_path / "new" / "dir")).is_dir()
