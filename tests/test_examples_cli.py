"""The example scripts refuse bad arguments in one line, as the CLI does:
a count of 0 by argparse before any work (exit 2), a library error as
``NAME: error: ...`` (exit 1), never a traceback or a table of nothing
(``noise_budget.py --tokens 0`` printed a budget of empty means; others
ended in numpy's tracebacks). Run as a user runs them, in a subprocess."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[1] / "examples"


def _run(*argv, cwd):
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize(("script", "option"), [
    ("quickstart.py", "--tokens"), ("quickstart.py", "--size"),
    ("noise_budget.py", "--tokens"), ("crosstalk_vs_optics.py", "--points"),
    ("photon_scaling.py", "--outputs"), ("quantisation_table.py", "--tokens"),
    ("llama_layer_sweep.py", "--seeds"),
])
def test_a_count_of_zero_is_refused_before_any_work(script, option, tmp_path):
    done = _run(EXAMPLES / script, option, "0", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[-1] == (f"{script}: error: argument {option}: 0 must be a "
                                            "positive integer")
    assert "Traceback" not in done.stderr and not list(tmp_path.iterdir())



@pytest.mark.parametrize("script", ["quickstart.py", "noise_budget.py", "photon_scaling.py",
                                    "quantisation_table.py"])
@pytest.mark.parametrize("value", ["-1", str(2**64)])
def test_a_seed_out_of_range_is_refused_naming_the_option(script, value, tmp_path):
    """``--seed -1`` ended in numpy's "expected non-negative integer" after
    the script had begun (exit 1, the option unnamed); ``--seed 2**64`` too."""
    done = _run(EXAMPLES / script, "--seed", value, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[-1] == (f"{script}: error: argument --seed: {value} is out "
                                            "of range; valid: integer in [0, 2**64)")

@pytest.mark.parametrize(("argv", "message"), [
    (["llama_layer_sweep.py", "--model", "no-such-model"],
     "llama_layer_sweep.py: error: no-such-model: no such model directory"),
    (["photon_scaling.py", "--set", "adc.bitz=4"],
     "photon_scaling.py: error: unknown config path 'adc.bitz'"),
    (["crosstalk_vs_optics.py", "--out", "missing/x.png"],
     "crosstalk_vs_optics.py: error: --out missing/x.png: no such directory"),
    # a review: "." wrote a hidden ".png" into the directory
    (["crosstalk_vs_optics.py", "--out", "."],
     "crosstalk_vs_optics.py: error: --out '.': expected a file name for the PNG, not a "
     "directory"),
    (["crosstalk_vs_optics.py", "--out", "new/"],  # failed after the sweep, writing new/.png
     "crosstalk_vs_optics.py: error: --out 'new/': expected a file name for the PNG, not a "
     "directory"),
])
def test_a_library_error_is_one_line_naming_the_script(argv, message, tmp_path):
    done = _run(EXAMPLES / argv[0], *argv[1:], cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith(message), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("raised", "code", "message"), [
    ('optical.SweepError("run failed at point adc.bits=4: out of memory")', 1,
     "llama_layer_sweep.py: error: run failed at point adc.bits=4: out of memory"),
    ("KeyboardInterrupt()", 130,
     "llama_layer_sweep.py: interrupted; run the same command again to resume the sweep"),
])
def test_a_failed_or_interrupted_sweep_is_one_line(raised, code, message, tmp_path):
    """A worker out of memory (the example's docstring warns of it) arrives as
    a SweepError, a Ctrl-C as KeyboardInterrupt: one line each (a traceback
    before), the second saying how to resume."""
    script = EXAMPLES / "llama_layer_sweep.py"
    model = EXAMPLES.parent / "models" / "llama-3.2-1b"
    code_text = (f"import runpy, sys, optical\n"
                 f"sys.path.insert(0, {str(EXAMPLES)!r})  # as `python examples/...` puts it\n"
                 f"def stopped(*args, **kwargs):\n    raise {raised}\n"
                 f"optical.sweep = stopped\n"
                 f"sys.argv = [{str(script)!r}, '--model', {str(model)!r}, '--tokens', '4']\n"
                 f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    done = _run("-c", code_text, cwd=tmp_path)
    assert done.returncode == code and done.stderr.strip() == message, done.stderr


def test_a_reader_gone_is_quiet(tmp_path):
    """`python examples/quickstart.py | head -1`: the pipe's reader leaves;
    the script stops quietly, as the optical commands do (it ended
    "error: [Errno 32] Broken pipe")."""
    read, write = os.pipe()
    os.close(read)  # gone before the first line
    try:
        done = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py"), "--tokens", "4",
                               "--size", "64"], stdout=write, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path, timeout=300)
    finally:
        os.close(write)
    assert done.returncode == 1 and done.stderr == ""
