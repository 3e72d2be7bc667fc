"""Machine configurations shared by the tests."""

import optical

#: Every (inputs, weights) encoding pair.
ENCODINGS = [(i, w) for i in ("offset", "split") for w in ("offset", "split")]


def ideal(**changes):
    """The ideal preset with ``changes`` (dotted paths)."""
    return optical.presets.get("ideal").replace(changes)


def noisy(**changes):
    """Every noise of the iris-like machine, strong enough to matter, small tiles."""
    base = {"core.inputs": 64, "core.outputs": 32, "source.photons_per_mac": 40.0,
            "source.rin_db_per_hz": -120.0, "detector.read_noise_electrons": 30.0,
            "adc.full_scale": "rms", "outliers.policy": "none"}
    return optical.presets.get("iris-like").replace({**base, **changes})
