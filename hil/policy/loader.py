"""Load a policy: a stored version, a `module:attribute`, or an ONNX model.

Whatever its source, a loaded policy maps a feature vector (float64, plant units, in the
order of `features`) to an action vector (plant units, in the order of `actions`):

- `module:attribute`: a callable `f(x) -> action`, an object with `act(x) -> action`, or a
  class instantiated without arguments. An object with `act_members(x) -> (M, n_actions)`
  is treated as an ensemble (its members' spread is sent to the safety wrapper).
- ONNX (optional, needs onnxruntime): first input takes float32 (1, n_features); first output
  is the action; an output named `members`, if present, the (M, n_actions) member actions.
- a stored version (hil/policy/store.py): kind mlp_ensemble (policy.npz), mlp (an imported network,
  hil/policy/mlp.py), entry, or onnx (with `io`: the recorded normalization and action mapping,
  hil/policy/graph_io.py). An `uncertainty` of kind bootstrap_heads in meta.json adds the
  version's heads (hil/policy/heads.py) as the members of its single network. A `residual`
  in meta.json (an imported residual model) wraps the network in hil/policy/residual.py: `act`
  is then the PID block's command plus the network's correction, and `residual` is set (the
  policy process feeds it each observation's measured outputs and applied inputs).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hil.policy.store import PolicyStore


@dataclass
class LoadedPolicy:
    version: str
    kind: str
    features: list[str]
    actions: list[str]
    act: Callable[[np.ndarray], np.ndarray]
    act_members: Callable[[np.ndarray], np.ndarray] | None = None
    meta: dict = field(default_factory=dict)
    action_is_member_mean: bool = False  # act(x) == act_members(x).mean(0): compute members once
    target: object = None  # an entry policy's object (its `period_s`, if declared, is set by the runner)
    residual: object = None  # hil.policy.residual.ResidualPolicy of a residual version (act is its act)


def _entry_object(entry: str):
    module_name, _, attr = entry.partition(":")
    if not module_name or not attr:
        raise ValueError(f"policy entry {entry!r} is not module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"policy entry {entry!r}: cannot import {module_name!r} ({exc})") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"policy entry {entry!r}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type):
        obj = obj()
    return obj


def load_entry(entry: str, features, actions, version: str | None = None) -> LoadedPolicy:
    obj = _entry_object(entry)
    if hasattr(obj, "act") and callable(obj.act):
        act = obj.act
    elif callable(obj):
        act = obj
    else:
        raise ValueError(f"policy entry {entry!r} is neither callable nor has act(observation)")
    members = getattr(obj, "act_members", None)
    return LoadedPolicy(version or entry, "entry", list(features), list(actions), act,
                        members if callable(members) else None, target=obj)


def load_onnx(path: str, features, actions, version: str | None = None, io_path=None) -> LoadedPolicy:
    """An ONNX graph; `io_path`: the normalization and action mapping recorded beside it
    (hil/policy/graph_io.py), applied around the graph (not to its `members` output, which
    must give actions in plant units)."""
    try:
        import onnxruntime as ort  # optional extra: pip install hil[onnx]
    except ImportError:
        raise ValueError("an ONNX policy needs onnxruntime (pip install 'hil[onnx]')") from None
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    in_name = sess.get_inputs()[0].name
    outs = [o.name for o in sess.get_outputs()]
    members_name = "members" if "members" in outs else None
    n_act = len(actions)

    dtype = np.float64 if sess.get_inputs()[0].type == "tensor(double)" else np.float32
    io = None
    if io_path is not None:
        from hil.policy.graph_io import IOMap

        io = IOMap.load(io_path)

    def act(x: np.ndarray) -> np.ndarray:
        z = x if io is None else io.obs(np.asarray(x, dtype=np.float64))
        res = sess.run([outs[0]], {in_name: np.asarray(z, dtype=dtype).reshape(1, -1)})
        h = np.asarray(res[0], dtype=np.float64).reshape(-1)
        return h if io is None else io.action(h)

    def act_members(x: np.ndarray) -> np.ndarray:
        z = x if io is None else io.obs(np.asarray(x, dtype=np.float64))
        res = sess.run([members_name], {in_name: np.asarray(z, dtype=dtype).reshape(1, -1)})
        return np.asarray(res[0], dtype=np.float64).reshape(-1, n_act)

    return LoadedPolicy(version or f"onnx:{path}", "onnx", list(features), list(actions), act,
                        act_members if members_name else None)


def load_version(store: PolicyStore, version: str, spec=None) -> LoadedPolicy:
    """Load version `version` (vN) of a policy store. `spec`: the plant's (a residual version's
    PID block reads it; default: the spec of meta.json's `plant`)."""
    meta = store.meta(version)
    kind = meta["kind"]
    path = store.path(version)
    features, actions = list(meta["features"]), list(meta["actions"])
    if kind == "mlp_ensemble":
        from hil.policy.ensemble import MLPEnsemble

        ens = MLPEnsemble.load(path / meta.get("file", "policy.npz"))
        if ens.n_features != len(features) or ens.n_actions != len(actions):
            raise ValueError(f"{path}: weights do not match {len(features)} features / {len(actions)} actions")
        pol = LoadedPolicy(version, kind, features, actions, ens.act, ens.act_members, meta,
                           action_is_member_mean=True)
    elif kind == "mlp":
        from hil.policy.mlp import MLPPolicy

        net = MLPPolicy.load(path / meta.get("file", "policy.npz"))
        if net.n_features != len(features) or net.n_actions != len(actions):
            raise ValueError(f"{path}: the network does not match {len(features)} features / {len(actions)} actions")
        pol = LoadedPolicy(version, kind, features, actions, net.act, None, meta)
        if meta.get("residual"):
            from hil.policy.residual import ResidualPolicy

            if spec is None:
                from plants.base import load_plant

                spec = load_plant(meta["plant"]).spec
            pol.residual = ResidualPolicy(net.act, meta["residual"], spec, features, actions)
            pol.act = pol.residual.act
    elif kind == "entry":
        pol = load_entry(meta["entry"], features, actions, version)
    elif kind == "onnx":
        io = meta.get("io")
        pol = load_onnx(str(path / meta["file"]), features, actions, version, io and path / io)
    else:
        raise ValueError(f"{path}: unknown policy kind {kind!r}")
    _attach_heads(pol, path, meta)
    pol.meta = meta
    return pol


def _attach_heads(pol: LoadedPolicy, path, meta: dict) -> None:
    """A single network imported with bootstrapped heads (hil/policy/heads.py): the heads are
    its members; its own action stays the proposal."""
    unc = meta.get("uncertainty") or {}
    if unc.get("kind") != "bootstrap_heads":
        return
    if pol.act_members is not None:
        raise ValueError(f"{path}: a policy with its own members and bootstrapped heads (one or the other)")
    from hil.policy.ensemble import MLPEnsemble
    from hil.policy.heads import CentredHeads

    heads = MLPEnsemble.load(path / unc.get("file", "heads.npz"))
    if heads.n_features != len(pol.features) or heads.n_actions != len(pol.actions):
        raise ValueError(f"{path}: the heads do not match {len(pol.features)} features / {len(pol.actions)} actions")
    pol.act_members = CentredHeads(pol.act, heads).act_members


def load_policy(section, scenario_path: str | None = None, version: str | None = None, spec=None) -> LoadedPolicy:
    """The policy a [policy] section names (`version` overrides section.version; `spec`: the
    plant's, for a residual version)."""
    from hil.safety.config import resolve_path

    if section.directory:
        store = PolicyStore(resolve_path(section.directory, scenario_path))
        return load_version(store, store.resolve(version or section.version), spec)
    if section.entry:
        return load_entry(section.entry, section.features, section.inputs)
    return load_onnx(str(resolve_path(section.onnx, scenario_path)), section.features, section.inputs)


def policy_store(section, scenario_path: str | None = None) -> PolicyStore | None:
    from hil.safety.config import resolve_path

    if not section.directory:
        return None
    return PolicyStore(resolve_path(section.directory, scenario_path))
