"""Reality-gap injection: sensor, actuator and latency gaps and domain randomization.

The loop uses `GapPipeline` (pipeline.py); the scenario's [gaps] section is `GapsSection`
(config.py, schema in its docstring); `batch_parameters` prepares randomized parameter sets
for a plant's batch form; latency profiles are read and written by profile.py.

Stale cached kernels after an edit of a kernel module are handled for the whole project by
hil/loop/jitcache.py (the cache key includes the digest of every project module a kernel's
file imports).
"""

from hil.gaps.config import GapsSection
from hil.gaps.pipeline import GapPipeline
from hil.gaps.randomization import batch_parameters

__all__ = ["GapPipeline", "GapsSection", "batch_parameters"]
