"""`engine generate` and `engine serve` from the command line."""

from __future__ import annotations

import pytest

from kernelloop.engine.cli import main

from tests.hf_checkpoints import make_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("cli") / "gqa", "gqa")


def test_generate_prints_the_completion(capsys, checkpoint):
    assert main(["generate", "w5 w6 w7", "--model", str(checkpoint), "--max-tokens", "4"]) == 0
    out = capsys.readouterr().out.split()
    assert len(out) == 4 and all(w.startswith("w") for w in out)


@pytest.mark.parametrize("argv,needle", [
    (["generate", "hi", "--model", "/nonexistent/model"], "is not a model directory"),
    (["generate", "hi", "--registry", "/tmp/x"], "--registry is only used with --kernels registry"),
    (["generate", "hi", "--model", "MODEL", "--dtype", "float16", "--device", "cpu", "--max-tokens", "0"], "max_tokens"),
    # one line each, no traceback
    (["serve", "--model", "MODEL", "--device", "cuda"], "--device cuda: no CUDA device is visible here"),
    (["serve", "--model", "MODEL", "--device", "tpu"], "unknown device 'tpu'"),
    (["generate", "hi", "--model", "MODEL", "--device", "cuda"], "use --device cpu"),
    (["generate", "hi", "--model", "MODEL", "--admission-window-ms", "-1"], "--admission-window-ms must be between"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, checkpoint, argv, needle):
    argv = [str(checkpoint) if a == "MODEL" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
