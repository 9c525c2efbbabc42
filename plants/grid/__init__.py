"""Power-grid physics as Numba kernels over preallocated arrays (imports nothing from hil/ or adapters/).

Modules: ``case`` (MATPOWER reader), ``ybus`` (admittance matrix with a fixed pattern),
``sparse_lu`` (ordering + symbolic/numeric LU), ``newton`` (AC power flow), ``topology``
(islands and slack choice), ``dynamics`` (frequency, conductor temperature, protection),
``sensitivity`` (PTDF/LODF), ``profiles`` (CSV load/renewable profiles), ``network`` (the
state layout and one quasi-static step that ties them together).
"""
