"""The campaign file (TOML). Relative paths resolve against the campaign file's directory.

    [campaign]
    name = "bioreactor_faults"
    mode = "lockstep"             # "lockstep" (deterministic, the default) | "realtime"
    duration_s = 86400.0          # simulated s per run (default: each scenario's loop.duration_s)
    seeds = 20                    # a count (seeds seed_base .. seed_base + n - 1) or a list of ints
    seed_base = 1
    out = "../runs/campaigns/{campaign}"   # results, recordings, reports (resumable)
    record_decimate = 1           # recording: every n-th step (criteria read the recording)
    storage = ""                  # Ray: a directory every node can write (default: results to the driver)

    [[scenarios]]
    name = "plc"                  # label in the matrix
    file = "../bioreactor_plc.toml"
    controller = "auto"           # lockstep: "softplc" runs the scenario's [softplc] program in
                                  # simulated time (hil/campaign/plc.py); "policy": policy + safety
                                  # processes over the bus; "none"; "auto": policy if [policy],
                                  # else softplc if [softplc], else none
    set = { "loop.step_s" = 1.0 } # overrides, as `hil run --set`
    duration_s = 7200.0           # this scenario's run length (else [campaign].duration_s)

    [faults.<name>]               # hil/campaign/faults.py for the kinds and their keys
    [[criteria]]                  # hil/campaign/criteria.py
    [envelopes.<name>]            # "y.dissolved_oxygen" = [20.0, 150.0], ... (named bounds)
    [canaries.<name>]             # known-bad runs that MUST fail (hil/campaign/canary.py); one
    scenario = "policy"           # that passes makes the campaign INVALID (exit code 3, banner)
    fault = { kind = "policy_ood", value = 1000.0, start_s = 600.0, duration_s = 120.0 }
    set = { "safety.confidence.mahalanobis" = false }   # overrides on top of the scenario's
    seeds = [1, 2]                # default: the campaign's first two seeds
    [report]
    signals = ["dissolved_oxygen", "agitation_power"]   # plotted per run (outputs / inputs)
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hil.errors import ConfigError
from hil.scenario.numbers import NUMBER_CONFIG, check_numbers, unlimited


class _Strict(BaseModel):
    """Unknown keys rejected; every number the user set sane (hil.scenario.numbers, as the scenario models)."""

    model_config = ConfigDict(extra="forbid", **NUMBER_CONFIG)

    @model_validator(mode="wrap")
    @classmethod
    def _sane_numbers(cls, data, handler):
        return check_numbers(cls, data, handler)


class CampaignMeta(_Strict):
    name: str
    description: str = ""
    mode: Literal["lockstep", "realtime"] = "lockstep"
    duration_s: float | None = Field(None, gt=0, description="simulated s per run")
    seeds: int | list[int] = 10
    seed_base: int = 1
    out: str = "runs/campaigns/{campaign}"
    record_decimate: int = Field(1, ge=1)
    storage: str = ""
    workers: int = Field(0, ge=0, description="local pool size; 0 = number of CPUs")
    run_timeout_s: float = Field(3600.0, gt=0, description="wall s a run may take before it is killed")
    baseline: str = Field("", description="the no-fault fault name paired criteria compare with "
                          "(default: the one fault of kind \"none\")")
    retries: int = Field(2, ge=0, le=10, description="times a run that errored (could not run) is run again")


class ScenarioRef(_Strict):
    name: str
    file: str
    controller: Literal["auto", "softplc", "policy", "none"] = "auto"
    set: dict[str, Any] = Field(default_factory=dict)
    duration_s: float | None = Field(None, gt=0)
    record_decimate: int | None = Field(None, ge=1, description="default [campaign].record_decimate")


class Criterion(_Strict):
    name: str
    kind: Literal["bounds", "envelope", "fallback_within", "rollback", "iae", "final", "time_outside",
                  "recording_complete", "run_completed", "safety_envelope", "paired_iae", "paired_time_outside",
                  "paired_final", "paired_detection", "paired_deviation"]
    signal: str | None = None
    signals: list[str] | None = None
    low: float = unlimited(-math.inf)
    high: float = unlimited(math.inf)
    envelope: str | None = None
    window: Literal["all", "fault", "after_fault", "after_start"] = "all"
    periods: int | None = Field(None, ge=1, description="fallback_within: loop steps after the fault start")
    expect: bool = True
    setpoint: float | None = None
    max: float = unlimited(math.inf)
    min: float = unlimited(-math.inf)
    max_s: float = unlimited(math.inf)
    scenarios: list[str] | None = None
    faults: list[str] | None = None
    # safety_envelope: which recorded values, which parts of the scenario's [safety.projection]
    on: list[Literal["cmd", "app"]] = Field(default_factory=lambda: ["cmd", "app"])
    checks: list[Literal["box", "rate", "linear"]] = Field(default_factory=lambda: ["box", "rate", "linear"])
    tolerance: float = Field(1e-6, ge=0, description="safety_envelope: slack, fraction of each input's span")
    # paired criteria (hil/campaign/paired.py): the faulted run against its no-fault twin
    max_ratio: float = unlimited(math.inf, gt=0, description="paired_iae: IAE(faulted) / max(IAE(baseline), floor)")
    floor: float = Field(0.0, ge=0, description="paired_iae: smallest baseline IAE divided by (signal unit x s)")
    max_extra_s: float = unlimited(math.inf, ge=0, description="paired_time_outside: extra s outside [low, high]")
    max_rel: float = unlimited(math.inf, ge=0, description="paired_final: |final - baseline final| / |baseline final|")
    max_abs: float = unlimited(math.inf, ge=0, description="paired_final: |final - baseline final|; paired_deviation: "
                               "max over the window of |value - baseline value| (signal unit)")


PAIRED_KINDS = ("paired_iae", "paired_time_outside", "paired_final", "paired_detection", "paired_deviation")


class Canary(_Strict):
    """A known-bad run: it must fail at least one criterion, or the campaign is invalid."""

    scenario: str
    fault: dict[str, Any] = Field(default_factory=lambda: {"kind": "none"})
    set: dict[str, Any] = Field(default_factory=dict)
    seeds: list[int] | None = None
    description: str = ""


class ReportSection(_Strict):
    signals: list[str] = Field(default_factory=list)
    points: int = Field(200, ge=20, le=5000, description="samples per plotted signal (per run, in the HTML)")


class Campaign(_Strict):
    campaign: CampaignMeta
    scenarios: list[ScenarioRef]
    faults: dict[str, dict[str, Any]] = Field(default_factory=dict)
    criteria: list[Criterion] = Field(default_factory=list)
    envelopes: dict[str, dict[str, tuple[float, float]]] = Field(default_factory=dict)
    canaries: dict[str, Canary] = Field(default_factory=dict)
    report: ReportSection = Field(default_factory=ReportSection)
    base_dir: str = ""  # the campaign file's directory (set by load_campaign)
    source: str = ""

    @property
    def name(self) -> str:
        return self.campaign.name

    def seed_list(self) -> list[int]:
        s = self.campaign.seeds
        return list(s) if isinstance(s, list) else [self.campaign.seed_base + i for i in range(int(s))]

    def fault_def(self, name: str) -> dict:
        """The fault a run names: [faults.<name>], or a canary's (`canary.<name>`)."""
        if name.startswith("canary.") and name[7:] in self.canaries:
            return self.canaries[name[7:]].fault
        return self.faults[name]

    def baseline_fault(self) -> str | None:
        """The fault name of the no-fault runs paired criteria compare with (None: no such run)."""
        if self.campaign.baseline:
            return self.campaign.baseline
        nones = [n for n, f in self.faults.items() if f.get("kind") == "none"]
        return nones[0] if nones else None

    def canary_seeds(self, name: str) -> list[int]:
        cn = self.canaries[name]
        return list(cn.seeds) if cn.seeds is not None else self.seed_list()[:2]

    def resolve(self, p: str) -> Path:
        path = Path(p.format(campaign=self.name))
        return path if path.is_absolute() else Path(self.base_dir) / path

    def out_dir(self, override: str | None = None) -> Path:
        return Path(override) if override else self.resolve(self.campaign.out)


def _loc(loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def parse_campaign(data: dict, source: str = "", base_dir: str | Path = ".") -> Campaign:
    """Validate a campaign (dict from TOML); every scenario is loaded and every fault and
    criterion checked against its plant. Raises ConfigError with the key path."""
    try:
        c = Campaign.model_validate({**data, "base_dir": str(Path(base_dir).resolve()), "source": source})
    except ValidationError as exc:
        raise ConfigError("", problems=[(_loc(e["loc"]), e["msg"]) for e in exc.errors()], source=source) from None
    if not c.scenarios:
        raise ConfigError("scenarios", "a campaign needs at least one [[scenarios]]", source=source)
    names = [s.name for s in c.scenarios]
    if len(set(names)) != len(names):
        raise ConfigError("scenarios", f"scenario names must be unique: {names}", source=source)
    if not c.seed_list():
        raise ConfigError("campaign.seeds", "no seeds", source=source)
    if not c.faults:
        raise ConfigError("faults", "a campaign needs at least one [faults.<name>] (kind = \"none\" for a baseline)",
                          source=source)
    for i, s in enumerate(c.scenarios):
        sc = load_scenario_ref(c, s, f"scenarios[{i}]")
        from plants.base import load_plant_module

        module = load_plant_module(sc.plant.model)
        for fname, f in c.faults.items():
            if applies(f, s.name):
                _check_fault_for(c, f, f"faults.{fname}", s, sc, module, source)
        for cname, cn in c.canaries.items():
            if cn.scenario == s.name:
                _check_fault_for(c, cn.fault, f"canaries.{cname}.fault", s, sc, module, source)
                if cn.set:
                    load_scenario_ref(c, s, f"canaries.{cname}.set", extra=scenario_overrides(cn))
    seeds = set(c.seed_list())
    for cname, cn in c.canaries.items():
        if cn.scenario not in names:
            raise ConfigError(f"canaries.{cname}.scenario", f"{cn.scenario!r} is not one of {names}", source=source)
        bad = [x for x in c.canary_seeds(cname) if x not in seeds]
        if bad or not c.canary_seeds(cname):
            raise ConfigError(f"canaries.{cname}.seeds", f"{bad or 'none'}: a canary runs on seeds of the campaign "
                              f"(its baseline runs are paired with it)", source=source)
    base = c.baseline_fault()
    if c.campaign.baseline and base not in c.faults:
        raise ConfigError("campaign.baseline", f"{base!r} is not one of {list(c.faults)}", source=source)
    if base is not None and c.faults[base].get("kind") != "none":
        raise ConfigError("campaign.baseline", f"{base!r} is a {c.faults[base].get('kind')} fault, not kind = \"none\"",
                          source=source)
    for i, cr in enumerate(c.criteria):
        if cr.kind in PAIRED_KINDS and base is None:
            raise ConfigError(f"criteria[{i}].kind", f"{cr.kind} compares with the no-fault run: add a "
                              f"[faults.none] kind = \"none\" (or name it in campaign.baseline)", source=source)
        if cr.kind in ("paired_iae", "paired_time_outside", "paired_final", "paired_deviation") and not cr.signal:
            raise ConfigError(f"criteria[{i}].signal", f"a {cr.kind} criterion needs a signal", source=source)
        if cr.kind == "paired_iae" and (cr.setpoint is None or math.isinf(cr.max_ratio)):
            raise ConfigError(f"criteria[{i}].max_ratio", "a paired_iae criterion needs a setpoint and max_ratio",
                              source=source)
        if cr.kind == "paired_time_outside" and math.isinf(cr.max_extra_s):
            raise ConfigError(f"criteria[{i}].max_extra_s", "a paired_time_outside criterion needs max_extra_s",
                              source=source)
        if cr.kind == "paired_final" and math.isinf(cr.max_rel) and math.isinf(cr.max_abs):
            raise ConfigError(f"criteria[{i}].max_rel", "a paired_final criterion needs max_rel or max_abs",
                              source=source)
        if cr.kind == "paired_deviation" and math.isinf(cr.max_abs):
            raise ConfigError(f"criteria[{i}].max_abs", "a paired_deviation criterion needs max_abs", source=source)
        if cr.kind == "paired_detection" and cr.periods is None:
            raise ConfigError(f"criteria[{i}].periods", "a paired_detection criterion needs periods", source=source)
        if cr.kind == "envelope" and cr.envelope not in c.envelopes:
            raise ConfigError(f"criteria[{i}].envelope", f"no [envelopes.{cr.envelope}]", source=source)
        if cr.kind in ("bounds", "iae", "final", "time_outside") and not (cr.signal or cr.signals):
            raise ConfigError(f"criteria[{i}].signal", f"a {cr.kind} criterion needs a signal", source=source)
        if cr.kind == "iae" and cr.setpoint is None:
            raise ConfigError(f"criteria[{i}].setpoint", "an iae criterion needs a setpoint", source=source)
        if cr.kind == "fallback_within" and cr.periods is None:
            raise ConfigError(f"criteria[{i}].periods", "a fallback_within criterion needs periods", source=source)
        for key, vals, known in (("scenarios", cr.scenarios, names), ("faults", cr.faults, list(c.faults))):
            for v in vals or ():
                if v not in known:
                    raise ConfigError(f"criteria[{i}].{key}", f"{v!r} is not one of {known}", source=source)
    return c


def _check_fault_for(c: Campaign, f: dict, path: str, s: ScenarioRef, sc, module, source: str) -> None:
    from hil.campaign.faults import REALTIME_ONLY, check_fault

    _check_window(f, path, source, s.name)
    try:
        check_fault(f, path, sc.plant.load().spec, module)  # the scenario's spec: built from a model file too
    except ConfigError as exc:
        raise ConfigError(exc.path, exc.reason, source=source) from None
    kind = f.get("kind")
    if kind in REALTIME_ONLY and c.campaign.mode != "realtime":
        raise ConfigError(f"{path}.kind", f"{kind} needs campaign.mode = \"realtime\" (a real socket)", source=source)
    if kind.startswith(("policy_", "safety_")) and controller_of(s, sc) != "policy":
        raise ConfigError(f"{path}.scenarios", f"{kind} needs a scenario with a policy; limit it with "
                          f"scenarios = [...] (scenario {s.name!r} has none)", source=source)
    if kind.startswith(("plc_", "link_")) and controller_of(s, sc) != "softplc":
        raise ConfigError(f"{path}.scenarios", f"{kind} needs a scenario with a [softplc]; limit it with "
                          f"scenarios = [...] (scenario {s.name!r})", source=source)


def _check_window(f: dict, path: str, source: str, scenario: str | None = None) -> None:
    st = f.get("start_s", 0.0)
    if isinstance(st, dict):  # one start (or [low, high]) per scenario: where each scenario's process moves
        if scenario is not None and scenario not in st:
            raise ConfigError(f"{path}.start_s", f"no start for scenario {scenario!r} (the table has "
                              f"{', '.join(sorted(st)) or 'none'}; limit the fault with scenarios = [...])",
                              source=source)
        for name, one in st.items():
            _check_start(one, f"{path}.start_s.{name}", source)
    else:
        _check_start(st, f"{path}.start_s", source)
    d = f.get("duration_s", math.inf)
    if not (isinstance(d, (int, float)) and d > 0):
        raise ConfigError(f"{path}.duration_s", f"{d!r} is not a duration > 0 (s; inf = to the end)", source=source)
    if f.get("shape", "step") not in ("step", "ramp"):
        raise ConfigError(f"{path}.shape", f"{f.get('shape')!r}: step or ramp", source=source)
    sa = f.get("stop_after_s", math.inf)
    if not (isinstance(sa, (int, float)) and sa >= 0):
        raise ConfigError(f"{path}.stop_after_s", f"{sa!r} is not a duration >= 0 (s)", source=source)


def _check_start(st, path: str, source: str) -> None:
    if isinstance(st, list):
        if len(st) != 2 or not st[0] <= st[1] or st[0] < 0:
            raise ConfigError(path, f"{st}: [low, high] with 0 <= low <= high", source=source)
    elif not (isinstance(st, (int, float)) and not isinstance(st, bool) and st >= 0 and math.isfinite(st)):
        raise ConfigError(path, f"{st!r} is not a time >= 0 (s)", source=source)


def applies(fault: dict, scenario_name: str) -> bool:
    only = fault.get("scenarios")
    return only is None or scenario_name in only


def decimate_of(c: Campaign, run) -> int:
    """Recorded rows per step of a run (hil/campaign/expand.py RunSpec): its scenario's
    record_decimate, else the campaign's."""
    ref = next(s for s in c.scenarios if s.name == run.scenario)
    return int(ref.record_decimate or c.campaign.record_decimate)


def controller_of(ref: ScenarioRef, sc) -> str:
    if ref.controller != "auto":
        return ref.controller
    if sc.policy is not None:
        return "policy"
    if sc.softplc is not None:
        return "softplc"
    return "none"


def scenario_overrides(ref) -> dict:
    """`set = {"a.b" = v}` -> nested dict (as hil run --set)."""
    out: dict = {}
    for key, value in ref.set.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def load_scenario_ref(c: Campaign, ref: ScenarioRef, path: str = "scenarios", extra: dict | None = None):
    """The validated scenario a campaign entry names (file relative to the campaign file)."""
    from hil.scenario.config import _deep_merge, load_scenario

    over = scenario_overrides(ref)
    if extra:
        _deep_merge(over, extra)
    f = c.resolve(ref.file)
    try:
        return load_scenario(f, over)
    except ConfigError as exc:
        raise ConfigError(f"{path}.file", f"{f}: {exc}", source=c.source) from None


def load_campaign(path: str | Path) -> Campaign:
    from hil.scenario.config import read_config_text

    path = Path(path)
    try:
        data = tomllib.loads(read_config_text(path, "campaign"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"not valid TOML: {exc}", source=str(path)) from None
    return parse_campaign(data, source=str(path), base_dir=path.resolve().parent)
