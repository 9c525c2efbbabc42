"""Reality-gap injection: sensor, actuator and latency gaps and domain randomization.

The loop uses `GapPipeline` (pipeline.py); the scenario's [gaps] section is `GapsSection`
(config.py, schema in its docstring); `batch_parameters` prepares randomized parameter sets
for a plant's batch form; latency profiles are read and written by profile.py.
"""

from hil.gaps import _cache

_cache.drop_stale()  # before any kernel is compiled or loaded from the cache

from hil.gaps.config import GapsSection  # noqa: E402
from hil.gaps.pipeline import GapPipeline  # noqa: E402
from hil.gaps.randomization import batch_parameters  # noqa: E402

__all__ = ["GapPipeline", "GapsSection", "batch_parameters"]
