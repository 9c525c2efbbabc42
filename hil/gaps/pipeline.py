"""The gap pipeline the loop calls: actuation delay + actuator gap, sensor gap + observation delay.

Per step the loop (hil/runtime.py) calls

    gaps.actuate(t, u_cmd, u_applied)       # before plant.step: commands -> applied inputs
    plant.step(...)
    gaps.sense(t + step_s, y_true, y_meas)  # after it: true outputs -> measured outputs

with t in simulated seconds. Each is one call of an @njit(nogil) kernel over one buffer
allocated by `build` (every gap's parameters, state, streams and delay rings: hil/gaps/arena.py),
entered through the compiled entry point (the caller's arrays are type-checked once, when first
seen); nothing is allocated per step and the result depends only on (seed, episode) and
the inputs, bit for bit. At an episode start: `drawn = gaps.randomize(plant.p, episode)` (plant
and gap parameters; record `drawn` with the run) then `gaps.reset(episode)` (states, delay
rings and random streams).

Random streams of an episode (SplitMix64, hil/gaps/rng.py): sensor output i feature f -> stream
5*i + f; actuation channel c -> 1_000_000 + c; observation channel c -> 2_000_000 + c.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
from numba import njit, typeof

from hil.errors import ConfigError
from hil.gaps import actuator as act
from hil.gaps import latency as lat
from hil.gaps import sensor as sen
from hil.gaps.arena import Arena, f1, f2, f3, header, i1, i2, u1
from hil.gaps.checks import field_limits
from hil.gaps.config import ActuatorGap, GapsSection, LatencyChannel, SensorGap
from hil.gaps.profile import load_profile, select_series
from hil.gaps.randomization import STREAM_GAPS, PlantRandomizer, draw, episode_rng
from hil.gaps.rng import seed_streams

STREAM_ACTUATION = 1_000_000
STREAM_OBSERVATION = 2_000_000


# arena slots (order of Arena.put in _bind_arena)
A_WORK, A_L, A_I, A_R, A_T, A_V, A_SIGCH, A_PROF, A_AP, A_AS = range(10)
S_WORK, S_SP, S_SX, S_SR, S_L, S_I, S_R, S_T, S_V, S_SIGCH, S_PROF = range(11)


@njit(cache=True, nogil=True)
def _actuate(B, t, u_cmd, u_app):
    H = header(B)
    work = f1(B, H, A_WORK)
    lat.delay_apply(t, u_cmd, work, f2(B, H, A_L), i2(B, H, A_I), u1(B, H, A_R),
                    f3(B, H, A_T), f2(B, H, A_V), i1(B, H, A_SIGCH), f1(B, H, A_PROF))
    act.actuator_apply(t, work, u_app, f2(B, H, A_AP), f2(B, H, A_AS))


@njit(cache=True, nogil=True)
def _sense(B, t, y_true, y_meas):
    H = header(B)
    work = f1(B, H, S_WORK)
    sen.sensor_apply(t, y_true, work, f2(B, H, S_SP), f2(B, H, S_SX), u1(B, H, S_SR))
    lat.delay_apply(t, work, y_meas, f2(B, H, S_L), i2(B, H, S_I), u1(B, H, S_R),
                    f3(B, H, S_T), f2(B, H, S_V), i1(B, H, S_SIGCH), f1(B, H, S_PROF))


def _bind_arena(attrs: list[tuple[object, str]]) -> np.ndarray:
    """Pack the named arrays of objects into one arena buffer and rebind them to its views."""
    arena = Arena()
    for o, name in attrs:
        arena.put(getattr(o, name))
    B, views = arena.pack()
    for (o, name), v in zip(attrs, views):
        setattr(o, name, v)
    return B


def _entry_point(dispatcher, args):
    """The compiled function for these argument types, bypassing the type dispatch."""
    dispatcher(*args)
    sig = tuple(typeof(a) for a in args)
    return dispatcher.overloads[sig].entry_point


def _check_vector(a, n: int, name: str, writable: bool = False) -> None:
    if not (isinstance(a, np.ndarray) and a.dtype == np.float64 and a.ndim == 1 and a.size == n
            and a.flags.c_contiguous and a.flags.aligned and (a.flags.writeable or not writable)):
        raise TypeError(f"{name} must be a C-contiguous float64 array of {n} values")


def _pack_channels(chans: dict[str, LatencyChannel], spec, kind: str):
    """[(channel dict, signal indices, packed tuple)], packed profile array, names.
    packed tuple: (kind, offset, n, lowest delay s, highest delay s) of a channel's samples or
    histogram."""
    chunks, out, names, off = [], [], [], 0
    for name, ch in chans.items():
        sigs = [spec.index(kind, s) for s in (ch.signals or [name])]
        packed = None
        if ch.dist in ("empirical", "profile"):
            if ch.dist == "empirical":
                data, n, d = np.asarray(ch.samples_s, np.float64), len(ch.samples_s), lat.D_SAMPLES
                low, high = float(data.min()), float(data.max())
            else:
                series = select_series(load_profile(ch.file), ch.series)
                data, n = series.packed()
                low, high = series.low, series.high
                if series.samples is None:
                    d = lat.D_HIST
                else:
                    d = lat.D_SEQUENCE if ch.replay == "sequence" else lat.D_SAMPLES
            packed = (d, off, n, low, high)
            chunks.append(data)
            off += data.size
        out.append((ch.model_dump(), sigs, packed))
        names.append(name)
    prof = np.concatenate(chunks) if chunks else np.zeros(1)
    return out, prof, names


def _bounds(packed_channels: list, names: list[str], max_delay_s: float, randomized: dict) -> list[float]:
    """The largest delay (s) of each packed channel (_pack_channels' order); a channel with a
    field drawn per episode (`randomized`: {name: fields}) is bounded by its clip only."""
    return [lat.channel_bound_s(ch, None if packed is None else packed[4], max_delay_s, bool(randomized.get(name)))
            for (ch, _, packed), name in zip(packed_channels, names)]


class GapPipeline:
    """All gaps of one plant instance; see the module docstring for the call protocol."""

    def __init__(self, section: GapsSection | None, spec, step_s: float, seed: int,
                 base_params: np.ndarray | None = None):
        if section is not None:  # array groups -> their elements, once (hil/gaps/groups.py)
            from hil.gaps.groups import expand_groups

            section = expand_groups(section, spec)[0]
        self.section, self.spec, self.step_s, self.seed = section, spec, float(step_s), int(seed)
        on = section is not None and section.enabled
        sec = section if on else GapsSection()
        rz = sec.randomize
        n_in, n_out = spec.n_inputs, spec.n_outputs
        self.plant_randomizer = PlantRandomizer(sec if on else None, spec, seed, base_params)
        # base configuration of every gap that exists (configured or randomized)
        self._sensor_cfg = [None] * n_out
        for name in set(sec.sensors) | set(rz.sensors):
            g = sec.sensors.get(name, SensorGap())
            self._sensor_cfg[spec.index("outputs", name)] = g.model_dump()
        self._act_cfg = [None] * n_in
        for name in set(sec.actuators) | set(rz.actuators):
            g = sec.actuators.get(name, ActuatorGap())
            self._act_cfg[spec.index("inputs", name)] = g.model_dump()
        self.sensors = sen.SensorBank(self._sensor_cfg, spec.lows("outputs"),
                                      spec.highs("outputs"), step_s)
        self.actuators = act.ActuatorBank(self._act_cfg, spec.lows("inputs"),
                                          spec.highs("inputs"), step_s)
        obs, obs_prof, obs_names = _pack_channels(sec.latency.observation, spec, "outputs")
        acn, acn_prof, acn_names = _pack_channels(sec.latency.actuation, spec, "inputs")
        self._chan_cfg = {"observation": {n: c[0] for n, c in zip(obs_names, obs)},
                          "actuation": {n: c[0] for n, c in zip(acn_names, acn)}}
        self._chan_idx = {"observation": {n: i for i, n in enumerate(obs_names)},
                          "actuation": {n: i for i, n in enumerate(acn_names)}}
        try:  # rings sized to the delays each channel can draw (hil/gaps/latency.py channel_bound_s)
            self.observation = lat.DelayLine(obs, n_out, step_s, sec.max_delay_s, obs_prof,
                                             _bounds(obs, obs_names, sec.max_delay_s,
                                                     rz.latency.get("observation", {})))
            self.actuation = lat.DelayLine(acn, n_in, step_s, sec.max_delay_s, acn_prof,
                                           _bounds(acn, acn_names, sec.max_delay_s,
                                                   rz.latency.get("actuation", {})))
        except ValueError as exc:
            raise ConfigError("gaps.max_delay_s", str(exc)) from None
        self._targets = self._gap_targets(rz)
        self._work_in = np.zeros(n_in)
        self._work_out = np.zeros(n_out)
        self.identity = not (self.sensors.active or self.actuators.active
                             or self.observation.active or self.actuation.active)
        a, s, d, o = self.actuators, self.sensors, self.actuation, self.observation
        self._act_buf = _bind_arena([
            (self, "_work_in"), (d, "L"), (d, "I"), (d, "R"), (d, "T"), (d, "V"), (d, "sigch"),
            (d, "prof"), (a, "P"), (a, "S")])
        self._sense_buf = _bind_arena([
            (self, "_work_out"), (s, "P"), (s, "X"), (s, "R"), (o, "L"), (o, "I"), (o, "R"),
            (o, "T"), (o, "V"), (o, "sigch"), (o, "prof")])
        # compile (or load from the cache) and keep the entry points with the buffer bound:
        # a call then unboxes 3 arrays and skips Numba's type dispatch (~2x cheaper)
        u, y = np.zeros(n_in), np.zeros(n_out)
        self._act_call = partial(_entry_point(_actuate, (self._act_buf, 0.0, u, u.copy())),
                                 self._act_buf)
        self._sense_call = partial(_entry_point(_sense, (self._sense_buf, 0.0, y, y.copy())),
                                   self._sense_buf)
        self._a_in = self._a_out = self._s_in = self._s_out = None
        self.episode = 0
        self.reset(0)

    # ---- construction ----
    @classmethod
    def build(cls, section: GapsSection | None, spec, step_s: float, seed: int,
              base_params: np.ndarray | None = None) -> "GapPipeline":
        """Resolve names to indices, allocate every buffer once. section None -> identity.

        base_params: the plant parameters relative randomization scales (default the spec
        nominal; pass plant.p after scenario overrides). Raises ConfigError on bad config."""
        if section is not None and section.enabled:
            from types import SimpleNamespace

            fake = SimpleNamespace(loop=SimpleNamespace(step_s=step_s))
            problems = section.validate_against(spec, fake)
            if problems:
                raise ConfigError("", problems=problems)
        return cls(section, spec, step_s, seed, base_params)

    @staticmethod
    def _gap_targets(rz) -> list:
        """[(record key, group, name, field, Dist, (lo, hi))] sorted by record key."""
        out = []
        for group, model, table in (("sensors", SensorGap, rz.sensors),
                                    ("actuators", ActuatorGap, rz.actuators)):
            for name, fields in table.items():
                for field, d in fields.items():
                    out.append((f"gaps.{group}.{name}.{field}", group, name, field, d,
                                field_limits(model, field)))
        for direction, chans in rz.latency.items():
            for name, fields in chans.items():
                for field, d in fields.items():
                    out.append((f"gaps.latency.{direction}.{name}.{field}", direction, name,
                                field, d, field_limits(LatencyChannel, field)))
        return sorted(out, key=lambda x: x[0])

    # ---- episodes ----
    def randomize(self, p: np.ndarray, episode: int = 0) -> dict[str, float]:
        """Draw plant parameters (in place into p, plant units) and gap parameters for an
        episode, reproducible from (seed, episode); return {"plant.<param>": v,
        "gaps.<group>.<name>.<field>": v} for the record. Gap parameters not drawn keep their
        configured values (draws never compound across episodes)."""
        drawn = self.plant_randomizer.draw_into(p, episode)
        if not self._targets:
            return drawn
        rng = episode_rng(self.seed, episode, STREAM_GAPS)
        updates: dict[tuple[str, str], dict] = {}
        for key, group, name, field, d, (lo, hi) in self._targets:
            v = draw(d, rng, lo, hi)
            if field.endswith("bits"):
                v = float(min(max(round(v), 1), 32))
            updates.setdefault((group, name), {})[field] = int(v) if field.endswith("bits") else v
            drawn[key] = float(v)
        for (group, name), upd in updates.items():
            if group == "sensors":
                i = self.spec.index("outputs", name)
                self.sensors.set(i, {**self._sensor_cfg[i], **upd})
            elif group == "actuators":
                i = self.spec.index("inputs", name)
                self.actuators.set(i, {**self._act_cfg[i], **upd})
            else:
                line = self.observation if group == "observation" else self.actuation
                line.set(self._chan_idx[group][name], {**self._chan_cfg[group][name], **upd})
        return drawn

    def reset(self, episode: int = 0) -> None:
        """Clear every gap state, delay ring and random stream; restart them for `episode`."""
        self.episode = int(episode)
        s, e = self.seed, self.episode
        self.sensors.reset(lambda R: seed_streams(R, s, e, 0))
        self.actuators.reset()
        self.actuation.reset(lambda R: seed_streams(R, s, e, STREAM_ACTUATION))
        self.observation.reset(lambda R: seed_streams(R, s, e, STREAM_OBSERVATION))

    # ---- per step (no allocation) ----
    def actuate(self, t_s: float, u_cmd: np.ndarray, u_applied: np.ndarray) -> None:
        """Commanded -> applied inputs (actuation delay + actuator gap), in place into u_applied.

        u_cmd, u_applied: C-contiguous float64 arrays of n_inputs (checked once per array)."""
        if u_cmd is self._a_in and u_applied is self._a_out:
            self._act_call(t_s, u_cmd, u_applied)
        elif self.identity:
            u_applied[:] = u_cmd
        else:
            self._bind_io("actuate", u_cmd, u_applied, self.spec.n_inputs)
            self._act_call(t_s, u_cmd, u_applied)

    def sense(self, t_s: float, y_true: np.ndarray, y_meas: np.ndarray) -> None:
        """True -> measured outputs (sensor gap + observation delay), in place into y_meas.

        y_true, y_meas: C-contiguous float64 arrays of n_outputs (checked once per array)."""
        if y_true is self._s_in and y_meas is self._s_out:
            self._sense_call(t_s, y_true, y_meas)
        elif self.identity:
            y_meas[:] = y_true
        else:
            self._bind_io("sense", y_true, y_meas, self.spec.n_outputs)
            self._sense_call(t_s, y_true, y_meas)

    def _bind_io(self, which: str, x_in, x_out, n: int) -> None:
        """Check the caller's arrays once (the entry points trust their types) and remember
        them, so later calls with the same arrays skip the check."""
        _check_vector(x_in, n, f"{which}: input")
        _check_vector(x_out, n, f"{which}: output", writable=True)
        if which == "actuate":
            self._a_in, self._a_out = x_in, x_out
        else:
            self._s_in, self._s_out = x_in, x_out

    # ---- introspection ----
    def describe(self) -> dict:
        """Which gaps are active, by signal (for logs and meta.json)."""
        def names(kind, cfgs):
            return [self.spec.names(kind)[i] for i, c in enumerate(cfgs) if c is not None]

        return {
            "sensors": names("outputs", self._sensor_cfg),
            "actuators": names("inputs", self._act_cfg),
            "latency": {k: list(v) for k, v in self._chan_idx.items()},
            "ring_slots": max(self.observation.m, self.actuation.m),
            "identity": self.identity,
            "step_s": self.step_s,
            "max_delay_s": math.nan if self.section is None else self.section.max_delay_s,
        }
