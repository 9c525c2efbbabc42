"""Plant models: pure Numba kernels with a typed spec (see plants/base.py for the contract)."""
