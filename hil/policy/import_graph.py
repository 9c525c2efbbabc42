"""`hil policy import` of a graph: an ONNX file, or a TorchScript module (converted to ONNX).

Both become a version of kind "onnx" (`policy.onnx`, run by onnxruntime: the `onnx` extra;
the policy process needs no torch):

- ONNX: the file is checked (onnx.checker), its first input must take the scenario's features
  (float32 or float64, shape (batch or 1, n_features)) and its first output give one value per
  action; an output named `members` (M, n_actions), if present, is an ensemble's members;
- TorchScript (`torch.jit.save`, needs the `rl` extra's torch): exported to ONNX with torch's
  TorchScript exporter (opset 17), then the ONNX graph's actions are compared with the
  TorchScript module's on features the env really gives (a random-action rollout, float32
  inputs): the import is refused unless they agree to 1e-6 of each action's span.

What the graph does not fold in is recorded beside it (hil/policy/graph_io.py, `io.npz`): the
observation statistics of an SB3 VecNormalize (`--vecnormalize`) and the action mapping
(`--action-map none|clip|squash`). hil/policy/imported.py then checks the actions against the
inputs' bounds on a rollout, writes the Mahalanobis statistics and fits the heads.
"""

from __future__ import annotations

import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np

from hil.policy.graph_io import IOMap
from hil.policy.imported import ImportRefused, check_sizes, scenario_env, write_version

ONNX_FILE = "policy.onnx"
IO_FILE = "io.npz"
OPSET = 17


def _session(path: Path):
    try:
        import onnx
        import onnxruntime as ort
    except ImportError:
        raise ImportRefused("importing a graph needs onnx and onnxruntime (pip install 'hil[onnx]')") from None
    try:
        onnx.checker.check_model(str(path))
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnx and onnxruntime raise their own types
        raise ImportRefused(f"{path} is not a valid ONNX model ({type(exc).__name__}: {str(exc)[:300]})") from None


def graph_act(sess, n_features: int, n_actions: int):
    """act(x) for one feature vector (float64 in and out) over an onnxruntime session, after
    checking its first input and output against the sizes; and whether it has `members`."""
    inp, out = sess.get_inputs()[0], sess.get_outputs()[0]
    if inp.type not in ("tensor(float)", "tensor(double)"):
        raise ImportRefused(f"the graph's input {inp.name!r} is {inp.type}, not float32/float64")
    dims = list(inp.shape)
    if len(dims) != 2 or (isinstance(dims[1], int) and dims[1] != n_features) or (
            isinstance(dims[0], int) and dims[0] != 1):
        check_sizes_text = f"({dims[-1] if dims else '?'},)"
        raise ImportRefused(f"the graph observes {check_sizes_text} (input {inp.name!r} of shape {dims}); it must "
                            f"take (batch, {n_features}): the scenario's features")
    odims = list(out.shape)
    if not odims or (isinstance(odims[-1], int) and odims[-1] != n_actions):
        raise ImportRefused(f"the graph acts on ({odims[-1] if odims else '?'},) (output {out.name!r} of shape "
                            f"{odims}), the scenario has {n_actions} bus inputs")
    dtype = np.float32 if inp.type == "tensor(float)" else np.float64

    def act(x: np.ndarray) -> np.ndarray:
        res = sess.run([out.name], {inp.name: np.asarray(x, dtype=dtype).reshape(1, -1)})[0]
        return np.asarray(res, dtype=np.float64).reshape(-1)

    return act, "members" in [o.name for o in sess.get_outputs()]


def _io_map(env, vecnormalize_path, action_map: str) -> IOMap:
    vecnorm = None
    if vecnormalize_path is not None:
        with open(vecnormalize_path, "rb") as f:
            vecnorm = pickle.load(f)
        if not hasattr(vecnorm, "obs_rms"):
            raise ImportRefused(f"{vecnormalize_path} is not a saved VecNormalize")
        if getattr(vecnorm, "norm_obs", False) and np.shape(vecnorm.obs_rms.mean) != (len(env.feature_names),):
            raise ImportRefused(f"{vecnormalize_path} normalizes {np.shape(vecnorm.obs_rms.mean)} observations, the "
                                f"scenario's env gives {len(env.feature_names)} features")
    try:
        return IOMap.from_vecnormalize(vecnorm, env.action_space.low, env.action_space.high, action_map)
    except ValueError as exc:
        raise ImportRefused(str(exc)) from None


def _write_graph(src_onnx: Path, scenario, env, out, io: IOMap, *, source: Path, training: dict, heads: int,
                 **kw) -> Path:
    sess = _session(src_onnx)
    raw, has_members = graph_act(sess, len(env.feature_names), len(env.action_names))

    def act(x):
        return io.action(raw(io.obs(x)))

    def files(vdir: Path) -> dict:
        shutil.copyfile(src_onnx, vdir / ONNX_FILE)
        keys = {"file": ONNX_FILE}
        if not io.identity:
            io.save(vdir / IO_FILE)
            keys["io"] = IO_FILE
        return keys

    training = {**training, "action_map": io.action_map, "obs_normalization": io.normalized,
                "graph_members": has_members}
    return write_version(scenario, env, out, kind="onnx", files=files, act=act, source=source, training=training,
                         heads=0 if has_members else heads, **kw)


def import_onnx(path, scenario, out, *, vecnormalize_path=None, action_map: str = "none", heads: int = 5,
                **kw) -> Path:
    """Import the ONNX model at `path` (see the module docstring); returns the version directory."""
    env = scenario_env(scenario)
    io = _io_map(env, vecnormalize_path, action_map)
    return _write_graph(Path(path), scenario, env, out, io, source=Path(path),
                        training={"format": "onnx", "vecnormalize": str(vecnormalize_path or "") or None},
                        heads=heads, **kw)


def sample_features(env, n: int, seed: int) -> np.ndarray:
    """n feature vectors the env gives under uniformly random actions (a spread of real states)."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    out = []
    for _ in range(n):
        out.append(obs)
        obs, _, term, trunc, _ = env.step(rng.uniform(env.action_space.low, env.action_space.high))
        if term or trunc:
            obs, _ = env.reset()
    return np.asarray(out)


def import_torchscript(path, scenario, out, *, vecnormalize_path=None, action_map: str = "none", heads: int = 5,
                       check_samples: int = 300, **kw) -> Path:
    """Import the TorchScript module at `path` via ONNX (see the module docstring)."""
    try:
        import torch
    except ImportError:
        raise ImportRefused("importing TorchScript needs torch (pip install 'hil[rl]')") from None
    env = scenario_env(scenario)
    try:
        module = torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError and others
        raise ImportRefused(f"{path} is not a TorchScript module ({type(exc).__name__}: {str(exc)[:200]})") from None
    n_f, n_a = len(env.feature_names), len(env.action_names)
    try:
        with torch.no_grad():
            y = module(torch.zeros(1, n_f, dtype=torch.float32))
    except Exception as exc:  # noqa: BLE001
        raise ImportRefused(f"the module does not take (1, {n_f}) float32 features, the scenario's "
                            f"({', '.join(env.feature_names)}): {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(y, torch.Tensor):
        raise ImportRefused(f"the module returns {type(y).__name__}, not one action tensor")
    check_sizes(env, None, int(y.shape[-1]) if y.dim() else -1, "the module")
    io = _io_map(env, vecnormalize_path, action_map)
    tmp = Path(out).parent / f".{Path(out).name}.import.onnx"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, (torch.zeros(1, n_f, dtype=torch.float32),), str(tmp), dynamo=False,
                              input_names=["features"], output_names=["action"], opset_version=OPSET,
                              dynamic_axes={"features": {0: "batch"}, "action": {0: "batch"}})
        # the exported graph must compute what the module computes, on states the env gives
        sess = _session(tmp)
        raw, _ = graph_act(sess, n_f, n_a)
        X = io.obs(sample_features(env, check_samples, kw.get("seed", 0)))
        with torch.no_grad():
            want = io.action(module(torch.as_tensor(X, dtype=torch.float32)).double().numpy().reshape(len(X), n_a))
        got = io.action(np.array([raw(x) for x in X]))  # compared in plant units
        span = env.action_space.high - env.action_space.low
        err = float(np.max(np.abs(got - want) / span))
        if not err <= 1e-6:
            raise ImportRefused(f"the ONNX export differs from the TorchScript module by {err:.3g} of the action span "
                                "(more than 1e-6): an operation the exporter does not translate faithfully")
        return _write_graph(tmp, scenario, env, out, io, source=Path(path), heads=heads,
                            training={"format": "torchscript", "exported_with": f"torch {torch.__version__}, opset "
                                      f"{OPSET}", "export_max_error_of_span": err,
                                      "vecnormalize": str(vecnormalize_path or "") or None}, **kw)
    finally:
        tmp.unlink(missing_ok=True)
