"""optical: a physics-level emulator of free-space optical matrix multipliers.

>>> import numpy as np, optical
>>> cfg = optical.presets.get("iris-like")
>>> x = np.ones((2, 8), np.float32); w = np.eye(8, dtype=np.float32)
>>> y = optical.matmul(x, w, optical.presets.get("ideal"), seed=0)
>>> bool(np.allclose(y, x @ w))
True
"""

from optical import core, metrics, presets
from optical.config import (
    ADCConfig,
    CalibrationConfig,
    CoreConfig,
    DACConfig,
    DetectorConfig,
    EncodingConfig,
    MappingConfig,
    MaskConfig,
    OpticalConfig,
    OpticsConfig,
    OutliersConfig,
    SourceConfig,
)
from optical.core import MatmulStats, Schedule, matmul, schedule
from optical.quant import ProgrammedWeights, program

__version__ = "0.1.0"

__all__ = [
    "ADCConfig",
    "CalibrationConfig",
    "CoreConfig",
    "DACConfig",
    "DetectorConfig",
    "EncodingConfig",
    "MappingConfig",
    "MaskConfig",
    "MatmulStats",
    "OpticalConfig",
    "OpticsConfig",
    "OutliersConfig",
    "ProgrammedWeights",
    "Schedule",
    "SourceConfig",
    "__version__",
    "core",
    "matmul",
    "metrics",
    "presets",
    "program",
    "schedule",
]
