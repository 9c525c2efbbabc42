"""Plant models: pure Numba kernels with a typed spec (see plants/base.py for the contract:
an "ode" module with a fixed SPEC, or a model built at load time from a model file by
`build(options)`; plants/spec.py for specs with array groups, algebraic and discrete state)."""
