"""Power-grid physics as Numba kernels over preallocated arrays (imports nothing from hil/ or adapters/).

Modules: ``case`` (MATPOWER reader), ``ybus`` (admittance matrix with a fixed pattern),
``sparse_lu`` (ordering + symbolic/numeric LU), ``block_lu`` (the power-flow Jacobian's 2x2 block
LU), ``newton`` (AC power flow), ``topology``
(islands and slack choice), ``injections`` (dispatch, inertial sharing, Q limits), ``dynamics``
(frequency, conductor temperature, protection, branch flows), ``step_kernels`` (the step's
bookkeeping), ``sensitivity`` (PTDF/LODF), ``profiles`` (CSV load/renewable profiles),
``params`` and ``network`` (the state layout and one quasi-static step that ties them together).

The plant module (``[plant] model = "grid"``): ``plant`` (``build``, ``OPTIONS``, ``FILE_OPTIONS``,
``FAULTS``) and ``line_limits`` (the safety wrapper's limit family ``SAFETY_LIMITS["line_rating"]``).
"""

from plants.grid.line_limits import SAFETY_LIMITS, SAFETY_LIMITS_COMPILED, SAFETY_LIMITS_COMPILED_FORM  # noqa: E402,F401
from plants.grid.plant import FAULTS, FILE_OPTIONS, OPTIONS, build  # noqa: E402,F401
