"""The library's version, and the version of the numbers it computes."""

__version__ = "0.1.0"

#: Bumped whenever a run's numbers for the same inputs, workload, config and
#: seed change (a physics fix, a metric added or redefined), so that a sweep
#: never mixes runs computed two ways: sweeps record it in their manifest and
#: runs (a resume refuses another), run ids hash it, and ``--json`` reports
#: keep it. 1: sweeps and reports that did not record it (before 2026-12-06);
#: 2: recorded; 3: RoPE frequencies as transformers computes them (bit for bit
#: at Llama's thetas and head sizes; Llama layers' numbers moved in the last
#: bits, growing with the position); 4: validate's (and a layer workload's)
#: held-out calibration input drawn as prompts as long as the scored ones,
#: not one prompt of ``calibration.max_tokens`` tokens (layers scored on
#: fewer tokens than that moved: all-MiniLM-L6-v2's layer 5 at 8 tokens by
#: +5 dB at the output); 5: runs record ``dac_clipped_fraction`` (a matmul
#: run's, and each optical product's and the totals' in a layer run), which
#: runs of 4 lack (a resumed sweep would have mixed rows with and without it).
RESULTS_VERSION = 5
