"""hil: a hardware-in-the-loop runtime for sim-to-real control."""

__version__ = "0.1.0"

# Numba's disk cache keyed on each kernel's project imports too (hil/loop/jitcache.py); does not
# import Numba, installs when it is imported
from hil.loop.jitcache import install_on_numba_import as _install_jitcache

_install_jitcache()
del _install_jitcache
