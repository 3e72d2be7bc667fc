"""optical: a physics-level emulator of free-space optical matrix multipliers.

>>> import numpy as np, optical
>>> cfg = optical.presets.get("iris-like")
>>> x = np.ones((2, 8), np.float32); w = np.eye(8, dtype=np.float32)
>>> y = optical.matmul(x, w, optical.presets.get("ideal"), seed=0)
>>> bool(np.allclose(y, x @ w))
True
"""

from optical import core, energy, metrics, plots, presets, transformer
from optical._version import __version__
from optical.config import (
    ADCConfig,
    CalibrationConfig,
    CoreConfig,
    DACConfig,
    DetectorConfig,
    EncodingConfig,
    EnergyConfig,
    MappingConfig,
    MaskConfig,
    OpticalConfig,
    OpticsConfig,
    OutliersConfig,
    SourceConfig,
)
from optical.core import MatmulStats, Schedule, matmul, schedule
from optical.quant import ProgrammedWeights, program
from optical.sweep import Range, SweepError, sweep
from optical.sweep import load as load_sweep
from optical.sweep import resume as resume_sweep
from optical.workloads import LayerWorkload, MatmulWorkload

__all__ = [
    "ADCConfig",
    "CalibrationConfig",
    "CoreConfig",
    "DACConfig",
    "DetectorConfig",
    "EncodingConfig",
    "EnergyConfig",
    "LayerWorkload",
    "MappingConfig",
    "MaskConfig",
    "MatmulStats",
    "MatmulWorkload",
    "OpticalConfig",
    "OpticsConfig",
    "OutliersConfig",
    "ProgrammedWeights",
    "Range",
    "Schedule",
    "SourceConfig",
    "SweepError",
    "__version__",
    "core",
    "energy",
    "load_sweep",
    "matmul",
    "metrics",
    "plots",
    "presets",
    "program",
    "resume_sweep",
    "schedule",
    "sweep",
    "transformer",
]
