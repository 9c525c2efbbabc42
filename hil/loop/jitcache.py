"""Numba's on-disk cache, keyed on the code a kernel calls as well as its own file.

Numba keys a `cache=True` function on a hash of its own source file only (numba/core/caching.py
`_SourceFileBackedLocatorMixin.get_source_stamp`). A cached kernel that calls a kernel from
another file (hil/loop/step.py `correct_stage` -> hil/calibration/residual.py `apply_correction`,
hil/gaps/pipeline.py -> hil/gaps/actuator.py, plants/* -> plants/integrators.py, the generated
steps of hil/loop/specialize.py -> all of those) keeps running the callee it was compiled with
after the callee's file is edited, until its cache files are deleted by hand.

`install()` puts one locator in front of Numba's own: for a function defined in a project file
(any file outside the interpreter's stdlib and site-packages: hil/, plants/, adapters/, the
generated steps, a user's plant package), it keeps Numba's choice of cache directory and adds to
the source stamp a digest of every project module the function's file imports, transitively
(imports anywhere in the file, absolute and relative; an over-approximation of what it calls).
An edit to any of them changes the stamp, Numba finds its index stale and recompiles. Files in
site-packages (numpy, numba) are not followed: they change with their version, not by edit.

Cost: each project file is parsed once per process (`ast`, memoised on its path, mtime and
size); the digest of a file's closure is memoised per file. `hil/__init__.py` calls
`install_on_numba_import()`, which does not import Numba itself (the CLI stays fast): it installs
when Numba is first imported, and re-keys the dispatchers created before (a plant module
imported ahead of hil) as long as they have not compiled yet.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

__all__ = ["install", "install_on_numba_import", "dependency_files", "dependency_digest"]


@functools.lru_cache(maxsize=None)
def _installed_roots() -> tuple[str, ...]:
    """Directories whose modules are installed, not edited: stdlib and site-packages."""
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {os.path.realpath(p) for p in sys.path if p.rstrip(os.sep).endswith(("site-packages", "dist-packages"))}
    return tuple(sorted(r + os.sep for r in roots))


def is_project_file(path: str) -> bool:
    """True for a .py file outside stdlib and site-packages (code that is edited in place)."""
    real = os.path.realpath(path)
    return real.endswith(".py") and os.path.isfile(real) and not real.startswith(_installed_roots())


@functools.lru_cache(maxsize=None)
def _top_locations(top: str) -> tuple[str, ...]:
    """The directories a top-level project package's submodules live in (empty for a module
    or an installed package). `find_spec` of a top-level name imports nothing."""
    mod = sys.modules.get(top)
    try:
        spec = getattr(mod, "__spec__", None) or importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.submodule_search_locations:
        return ()
    return tuple(p for p in spec.submodule_search_locations
                 if not (os.path.realpath(p) + os.sep).startswith(_installed_roots()))


@functools.lru_cache(maxsize=None)
def _module_file(name: str) -> str | None:
    """The project file of module `name` ("a.b.c" -> <a>/b/c.py or <a>/b/c/__init__.py), or None."""
    top, _, rest = name.partition(".")
    if not rest:
        try:
            spec = getattr(sys.modules.get(top), "__spec__", None) or importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return None
        origin = getattr(spec, "origin", None)
        return os.path.realpath(origin) if origin and is_project_file(origin) else None
    for root in _top_locations(top):
        base = os.path.join(root, *rest.split("."))
        for cand in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(cand):
                return os.path.realpath(cand)
    return None


def _package_of(path: str, module: str | None) -> str | None:
    """The package a relative import in `path` starts from (module "a.b.c" -> "a.b"; an
    __init__.py is its own package)."""
    if not module or module == "__main__":
        return None
    return module if os.path.basename(path) == "__init__.py" else module.rpartition(".")[0]


@functools.lru_cache(maxsize=None)
def _imports(path: str, mtime_ns: int, size: int, module: str | None) -> tuple[str, ...]:
    """Module names `path` imports anywhere in its body (functions included: cycles hidden in
    functions are still dependencies). `from p import n` yields p and p.n (n may be a module)."""
    del mtime_ns, size  # memoisation key only: an edited file is parsed again
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return ()
    names: list[str] = []
    package = _package_of(path, module)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if package is None:
                    continue
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts):
                    continue
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            if base:
                names.append(base)
                names += [f"{base}.{a.name}" for a in node.names if a.name != "*"]
    return tuple(dict.fromkeys(names))


def _module_name_of(path: str) -> str | None:
    """The dotted name of a project file, from the packages (dirs with __init__.py) around it."""
    p = Path(path)
    parts = [] if p.name == "__init__.py" else [p.stem]
    d = p.parent
    while (d / "__init__.py").is_file():
        parts.insert(0, d.name)
        d = d.parent
    return ".".join(parts) or None


def dependency_files(path: str) -> list[str]:
    """`path` and every project file it imports, transitively, sorted (real paths)."""
    start = os.path.realpath(path)
    seen = {start}
    todo = [start]
    while todo:
        f = todo.pop()
        try:
            st = os.stat(f)
        except OSError:
            continue
        for name in _imports(f, st.st_mtime_ns, st.st_size, _module_name_of(f)):
            dep = _module_file(name)
            if dep is not None and dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return sorted(seen)


_DIGESTS: dict[str, str] = {}


def dependency_digest(path: str) -> str:
    """sha256 (hex) of the contents of `path`'s dependency closure (dependency_files), each
    file's path relative to its closure's common root, then its bytes. Memoised per process."""
    key = os.path.realpath(path)
    if key not in _DIGESTS:
        files = dependency_files(key)
        root = os.path.commonpath([os.path.dirname(f) for f in files])
        h = hashlib.sha256()
        for f in files:
            h.update(os.path.relpath(f, root).encode() + b"\0")
            try:
                h.update(Path(f).read_bytes())
            except OSError:
                h.update(b"<unreadable>")
            h.update(b"\0")
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def _locator_class():
    from numba.core import caching

    class DependencyLocator(caching._CacheLocator):
        """Numba's own locator for the function (same cache directory, same file names), with
        the digest of the function's project imports added to its source stamp."""

        def __init__(self, inner, py_file):
            self._inner = inner
            self._py_file = py_file

        def ensure_cache_path(self):
            self._inner.ensure_cache_path()

        def get_cache_path(self):
            return self._inner.get_cache_path()

        def get_disambiguator(self):
            return self._inner.get_disambiguator()

        def get_source_stamp(self):
            return ("hil-deps-1", self._inner.get_source_stamp(), dependency_digest(self._py_file))

        @classmethod
        def from_function(cls, py_func, py_file):
            if not is_project_file(py_file):
                return None
            for other in caching.CacheImpl._locator_classes:
                if other is cls:
                    continue
                inner = other.from_function(py_func, py_file)
                if inner is not None:
                    return cls(inner, py_file)
            return None

    return DependencyLocator


_LOCATOR = None


def install() -> None:
    """Put the dependency-aware locator first in Numba's list (idempotent), and re-key the
    cached dispatchers of project modules created before that have not compiled yet."""
    global _LOCATOR
    from numba.core import caching

    if _LOCATOR is None:
        _LOCATOR = _locator_class()
    if caching.CacheImpl._locator_classes[:1] != [_LOCATOR]:
        caching.CacheImpl._locator_classes.insert(0, _LOCATOR)
    _rekey_existing()


def _rekey_existing() -> None:
    from numba.core.caching import FunctionCache
    from numba.core.registry import CPUDispatcher

    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not f or not is_project_file(f):
            continue
        for obj in list(vars(mod).values()):
            if (isinstance(obj, CPUDispatcher) and isinstance(obj._cache, FunctionCache)
                    and not obj.overloads and not isinstance(obj._cache._impl.locator, _LOCATOR)):
                obj.enable_caching()


class _NumbaImportHook:
    """A meta path finder that only watches for `numba`: once its module has executed, it
    leaves sys.meta_path and calls install(). (A `find_spec("numba")` that does not import, as
    dependency_files' own, only gets a spec whose loader nobody runs.)"""

    _finding = False

    def find_spec(self, name, path=None, target=None):
        if name != "numba" or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(name)  # the finders after this one
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_install(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            install()

        spec.loader.exec_module = exec_and_install
        return spec


def install_on_numba_import() -> None:
    """install() now if Numba is imported, else as soon as it is (without importing it)."""
    if "numba" in sys.modules:
        install()
    elif not any(isinstance(f, _NumbaImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _NumbaImportHook())
