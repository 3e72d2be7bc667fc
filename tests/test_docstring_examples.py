"""Every example in the library's docstrings runs and prints what it shows
(nothing else runs them: the suite does not pass --doctest-modules)."""

import doctest
import importlib
import importlib.util
import pathlib
import sys

import optical

ROOT = pathlib.Path(optical.__file__).parent


def _module_names():
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__main__":  # importing it would run the CLI
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if "jax" in name and importlib.util.find_spec("jax") is None:
            continue
        yield name


def test_every_docstring_example_runs_as_shown(capsys):
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    names = list(_module_names())
    for name in names:
        importlib.import_module(name)
        module = sys.modules[name]  # optical.sweep: the package's attribute is the function
        for test in finder.find(module, name):
            runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, capsys.readouterr().out
    assert len(names) > 40 and attempted >= 19  # every module was searched, examples found
