"""Energy and latency of optical prefill, component by component, against a GPU.

>>> import optical
>>> from optical.energy import gpu, model
>>> spec = optical.transformer.read_spec("models/llama-3.2-1b")  # doctest: +SKIP
>>> report = model.prefill(spec, 2048, optical.presets.get("iris-like"))  # doctest: +SKIP
>>> report.components["laser"], report.ttft  # doctest: +SKIP

Modules: :mod:`~optical.energy.counts` (digital work and memory traffic),
:mod:`~optical.energy.model` (the optical machine), :mod:`~optical.energy.gpu`
(the GPU baseline), :mod:`~optical.energy.workload` (optical prefill + GPU
decode), :mod:`~optical.energy.photons` (photons per MAC against width,
measured with the emulator), :mod:`~optical.energy.compare` (break-even).
"""

from optical.energy import compare, counts, gpu, model, photons, workload
from optical.energy.gpu import GPUS, GPUSpec, get_gpu
from optical.energy.model import COMPONENTS, PrefillEnergy, prefill
from optical.energy.photons import photon_scaling, required_photons
from optical.energy.workload import Workload, disaggregated

__all__ = [
    "COMPONENTS",
    "GPUS",
    "GPUSpec",
    "PrefillEnergy",
    "Workload",
    "compare",
    "counts",
    "disaggregated",
    "get_gpu",
    "gpu",
    "model",
    "photon_scaling",
    "photons",
    "prefill",
    "required_photons",
    "workload",
]
