import json

import pytest

import optical
from optical.cli import main


def test_config_command_applies_overrides_and_writes_json(tmp_path, capsys):
    out = tmp_path / "cfg.json"
    assert main(["config", "--preset", "iris-like", "--set", "adc.bits=6", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert optical.OpticalConfig.from_dict(data) == optical.presets.get("iris-like").replace(
        {"adc.bits": 6})
    assert "adc.bits" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["config", "--set", "adc.bitz=6"], "unknown config path 'adc.bitz'"),
    (["config", "--set", "adc.bits=six"], "adc.bits: cannot parse 'six'"),
    (["config", "--set", "adc.bits"], "expected PATH=VALUE"),
    (["config", "--preset", "nope"], "unknown preset 'nope'"),
])
def test_bad_options_fail_with_one_clear_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
