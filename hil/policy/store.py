"""The versioned policy directory: `<root>/v1`, `<root>/v2`, ... each one policy version.

A version directory holds `meta.json` and the files it names:

    {"format": "hil-policy", "format_version": 1, "version": "v2", "plant": "bioreactor",
     "kind": "mlp_ensemble" | "mlp" | "entry" | "onnx",
     "file": "policy.npz" (mlp_ensemble, mlp, onnx) | "entry": "module:attribute" (entry),
     "features": [...], "actions": [...],          # signal names (see hil/policy/features.py)
     "stats": "stats.npz",                        # training statistics: mean, cov of features
     "known_good": true, "created_utc": "...", "notes": "...", "training": {...}}

`known_good` is the release decision recorded with the version; rollback goes to the newest
known-good version older than the current one that has not itself been rolled back.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

FORMAT = "hil-policy"
FORMAT_VERSION = 1
_VERSION = re.compile(r"v(\d+)")


def version_number(version: str) -> int:
    m = _VERSION.fullmatch(version)
    if not m:
        raise ValueError(f"{version!r} is not a policy version (v1, v2, ...)")
    return int(m.group(1))


class PolicyStore:
    """Read (and write) one versioned policy directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def versions(self) -> list[str]:
        """Versions present (with a meta.json), oldest first."""
        if not self.root.is_dir():
            return []
        found = [p.name for p in self.root.iterdir() if _VERSION.fullmatch(p.name) and (p / "meta.json").is_file()]
        return sorted(found, key=version_number)

    def path(self, version: str) -> Path:
        version_number(version)
        return self.root / version

    def meta(self, version: str) -> dict:
        path = self.path(version) / "meta.json"
        try:
            meta = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"no policy version {version!r} in {self.root}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
        if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{path}: not a {FORMAT} v{FORMAT_VERSION} meta file")
        for key in ("kind", "features", "actions"):
            if key not in meta:
                raise ValueError(f"{path}: missing {key!r}")
        meta["version"] = version
        return meta

    def known_good(self, version: str) -> bool:
        return bool(self.meta(version).get("known_good", False))

    def resolve(self, wanted: str) -> str:
        """'vN', 'latest' or 'latest_known_good' -> an existing version."""
        versions = self.versions()
        if not versions:
            raise ValueError(f"no policy versions in {self.root}")
        if wanted == "latest":
            return versions[-1]
        if wanted == "latest_known_good":
            good = [v for v in versions if self.known_good(v)]
            if not good:
                raise ValueError(f"no known-good policy version in {self.root}")
            return good[-1]
        if wanted not in versions:
            raise ValueError(f"no policy version {wanted!r} in {self.root} (have: {', '.join(versions)})")
        return wanted

    def previous_known_good(self, current: str, exclude=()) -> str | None:
        """Newest known-good version older than `current`, not in `exclude`; None if there is none."""
        n = version_number(current)
        for v in reversed(self.versions()):
            if version_number(v) < n and v not in exclude and self.known_good(v):
                return v
        return None

    def stats(self, version: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(mean, covariance) of the training features, or None if the version has none."""
        meta = self.meta(version)
        name = meta.get("stats")
        if not name:
            return None
        with np.load(self.path(version) / name) as z:
            return np.asarray(z["mean"], dtype=np.float64), np.asarray(z["cov"], dtype=np.float64)

    def next_version(self) -> str:
        versions = self.versions()
        return f"v{version_number(versions[-1]) + 1 if versions else 1}"

    def write_meta(self, version: str, meta: dict) -> Path:
        path = self.path(version)
        path.mkdir(parents=True, exist_ok=True)
        full = {"format": FORMAT, "format_version": FORMAT_VERSION, "version": version, **meta}
        (path / "meta.json").write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
        return path
