"""An independent "real unit" for judging calibration: a fed-batch fermenter written here in
plain NumPy and integrated by scipy's adaptive LSODA at rtol 1e-8, NOT the plant kernel the
fitter simulates (plants/bioreactor.py, fixed-step RK4). The fitter is judged on data it did
not generate.

What it shares with the hil bioreactor model (same functional forms, own code): Contois
growth with O2 Monod and Arrhenius factors, pH factor, production, maintenance, CO2,
evaporation, kLa = kla_alpha sqrt(f_g) (P_w/V)^kla_beta. The shared parameters take the
values in `Reality.params` (the truth the tests check intervals against).

What it has and the model lacks (each switchable):
- foaming (`foam_rate_per_h`): the effective kLa is kla * f with df/dt = -foam_rate * f (1/h),
  so the oxygen transfer falls over the batch; a logged antifoam dose (extra column
  `antifoam`, 1 at the dose sample) resets f to 1. This is the slow unmodelled effect.
- pH closed by the unit's own on/off controller (`base_flow` commands logged, sampled at the
  log interval, deadband `ph_band`), on a buffered broth (buffer capacity `buffer_mol_per_L_pH`,
  mol/(L pH)); the model's pH is unbuffered.
- temperature held by a jacket PI controller (T and the jacket are not logged).
- sensors that drift: the online biomass probe (capacitance) drifts by `biomass_drift_per_h`
  g/(L h) from an offset; the DO probe by `do_drift_per_h` %/h; white noise on every sensor.
- offline lab samples (`biomass_lab`, `glucose_lab`, every `lab_every_h` h) with their own
  relative noise: the independent references (column role "reference").

Units: time in h inside, t_s (s) in the log; concentrations g/L, DO in % of saturation,
flows L/h, power W, temperature K.

CLI: `python -m hil.calibration.reality --out DIR --runs 3 --hours 48 --sample-s 10` writes
run<i>.csv (+ `--gzip`) and map.toml (the column map that reads them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.integrate import solve_ivp

R_GAS = 1.987  # cal/(mol K)

# state order of this generator (its own, not the plant kernel's)
Z_X, Z_S, Z_P, Z_C, Z_V, Z_CO2, Z_PH, Z_T, Z_FOAM, Z_IT = range(10)
NZ = 10

# PenSim values (Birol et al. 2002, Table 2) of the constants this reality shares with the model
PENSIM = dict(mu_x=0.092, K_x=0.15, K_ox=2e-2, K_op=5e-4, mu_p=0.005, K_p=2e-4, K_I=0.10, K_hyd=0.04,
              k_g=7e3, E_g=5100.0, k_d=1e33, E_d=50000.0, Y_xs=0.45, Y_xo=0.04, Y_ps=0.90, Y_po=0.20,
              m_x=0.014, m_o=0.467, alpha_1=0.143, alpha_2=4e-7, alpha_3=1e-4, K_1=1e-10, K_2=7e-5,
              gamma=1e-5, C_L_sat=1.16, kla_alpha=70.0, kla_beta=0.4, lambda_evap=2.5e-4, s_f=600.0,
              C_b=3.0, C_a=3.0)
TRUE_SHARED = {"mu_x": 0.100, "Y_xs": 0.42, "kla_alpha": 80.0, "Y_xo": 0.04}


@dataclass
class Reality:
    """One unit: its parameters, unmodelled mechanisms and sensors (see module docstring)."""

    params: dict = field(default_factory=lambda: {**PENSIM, **TRUE_SHARED})
    foam_rate_per_h: float = 0.015         # kLa falls ~30 % over a day without antifoam; 0 = off
    antifoam_at_h: tuple = (24.0,)         # logged antifoam doses (reset the foam)
    ph_setpoint: float = 5.0
    ph_band: float = 0.02                  # on/off deadband, pH
    base_on_L_per_h: float = 0.004         # base pump flow when on (C_b mol/L)
    buffer_mol_per_L_pH: float = 5e-4      # broth buffer capacity
    T_set_K: float = 298.0
    jacket_kp_per_h: float = 20.0          # PI on the jacket: dT/dt += kp (T_set - T) + ki I
    jacket_ki_per_h2: float = 50.0
    do_noise_pct: float = 0.4
    do_drift_per_h: float = 0.0            # DO probe drift, % of saturation per h
    biomass_noise: float = 0.05            # online probe white noise, g/L
    biomass_offset: float = 0.15           # online probe offset at t = 0, g/L
    biomass_drift_per_h: float = 0.01      # online probe drift, g/(L h)
    co2_noise: float = 0.01
    ph_noise: float = 0.005
    lab_every_h: float = 4.0
    lab_rel_noise: float = 0.03            # lab assay relative noise (1 sigma)
    x0: dict = field(default_factory=lambda: {"biomass": 1.0, "glucose": 15.0, "volume": 100.0})


def _rhs(t_h, z, u, p, r: Reality):
    """dz/dt (per h). u = (feed L/h, base L/h, aeration L/h, power W)."""
    X, S, P, C, V, _co2, pH, T, foam, I_T = z
    F, Fb, fg, Pw = u
    Xp, Sp, Cp = max(X, 0.0), max(S, 0.0), max(C, 0.0)
    H = 10.0 ** (-pH)
    ph_fac = 1.0 / (1.0 + p["K_1"] / H + H / p["K_2"])
    arr_g = p["k_g"] * math.exp(-p["E_g"] / (R_GAS * T))
    arr_d = p["k_d"] * math.exp(-p["E_d"] / (R_GAS * T))
    mu_g = p["mu_x"] * ph_fac * Sp / (p["K_x"] * Xp + Sp + 1e-300) * Cp / (p["K_ox"] * Xp + Cp + 1e-300) * arr_g
    mu = mu_g - arr_d
    mu_pp = p["mu_p"] * Sp / (p["K_p"] + Sp + Sp * Sp / p["K_I"]) * Cp ** 3 / (p["K_op"] * Xp + Cp ** 3 + 1e-300)
    kla = p["kla_alpha"] * math.sqrt(max(fg, 0.0)) * (max(Pw, 0.0) / V) ** p["kla_beta"] * foam
    F_loss = V * p["lambda_evap"] * (math.exp(5.0 * (T - 273.0) / 100.0) - 1.0)
    dV = F + Fb - F_loss
    D = dV / V
    lim_s = min(1.0, Sp / 1e-3)
    lim_o = min(1.0, Cp / 1e-2)
    dz = np.empty(NZ)
    dz[Z_X] = (mu - D) * X
    dz[Z_S] = -(mu_g / p["Y_xs"] + mu_pp / p["Y_ps"] + p["m_x"] * lim_s) * X + F * p["s_f"] / V - D * S
    dz[Z_P] = mu_pp * X - (p["K_hyd"] + D) * P
    dz[Z_C] = -(mu_g / p["Y_xo"] + mu_pp / p["Y_po"] + p["m_o"] * lim_o) * X + kla * (p["C_L_sat"] - C) - D * C
    dz[Z_V] = dV
    dz[Z_CO2] = (p["alpha_1"] * mu_g + p["alpha_2"]) * X + p["alpha_3"]
    # buffered broth: net strong base inflow (mol/(L h)) over the buffer capacity (mol/(L pH))
    dz[Z_PH] = ((p["C_b"] * Fb) / V - p["gamma"] * mu_g * X) / r.buffer_mol_per_L_pH
    # jacket PI: the reaction heat (~1 K/h at most here) is removed by the jacket
    q_rxn_K_per_h = 60.0 * mu_g * X / 1500.0
    e = r.T_set_K - T
    dz[Z_T] = q_rxn_K_per_h + r.jacket_kp_per_h * e + r.jacket_ki_per_h2 * I_T
    dz[Z_IT] = e
    dz[Z_FOAM] = -r.foam_rate_per_h * foam
    return dz


def simulate(r: Reality, t_s: np.ndarray, feed: np.ndarray, aeration: np.ndarray, power: np.ndarray):
    """Integrate the unit over sample times t_s (s) with the given commanded inputs (held
    between samples). Returns (Z (n, NZ) true states at the samples, base_cmd (n,) L/h,
    antifoam (n,) 0/1)."""
    p = r.params
    n = t_s.size
    t_h = t_s / 3600.0
    z = np.zeros(NZ)
    z[Z_X], z[Z_S], z[Z_V] = r.x0["biomass"], r.x0["glucose"], r.x0["volume"]
    z[Z_C] = p["C_L_sat"]
    z[Z_CO2] = 0.5
    z[Z_PH] = r.ph_setpoint
    z[Z_T] = r.T_set_K
    z[Z_FOAM] = 1.0
    Z = np.zeros((n, NZ))
    base = np.zeros(n)
    anti = np.zeros(n)
    for a in r.antifoam_at_h:
        k = int(np.searchsorted(t_h, a))
        if k < n:
            anti[k] = 1.0
    Z[0] = z
    cmd = 0.0
    k = 0
    chunk = 360
    while k < n - 1:
        if anti[k]:
            z = z.copy()
            z[Z_FOAM] = 1.0
            Z[k] = z
        # PLC at sample k: on/off with hysteresis on the measured-free pH
        if z[Z_PH] < r.ph_setpoint - r.ph_band:
            cmd = r.base_on_L_per_h
        elif z[Z_PH] > r.ph_setpoint + r.ph_band:
            cmd = 0.0
        base[k] = cmd
        # one solve over samples with constant commands; stop at the first sample where the
        # PLC would switch or an input or event changes, restart there
        end = min(n - 1, k + chunk)
        u_k = (feed[k], aeration[k], power[k])
        for j in range(k + 1, end):
            if (feed[j], aeration[j], power[j]) != u_k or anti[j]:
                end = j
                break
        u = (feed[k], cmd, aeration[k], power[k])
        sol = solve_ivp(_rhs, (t_h[k], t_h[end]), z, method="LSODA", t_eval=t_h[k:end + 1],
                        args=(u, p, r), rtol=1e-8, atol=1e-10)
        if not sol.success:
            raise RuntimeError(f"reality: solve_ivp failed at t = {t_h[k]:.3f} h: {sol.message}")
        Y = sol.y.T
        stop = end
        for j in range(1, end - k):
            ph = Y[j, Z_PH]
            if (cmd == 0.0 and ph < r.ph_setpoint - r.ph_band) or (cmd > 0.0 and ph > r.ph_setpoint + r.ph_band):
                stop = k + j
                break
        if stop != end:  # restart exactly at the switching sample (no dense-output error)
            sol = solve_ivp(_rhs, (t_h[k], t_h[stop]), z, method="LSODA", t_eval=t_h[k:stop + 1],
                            args=(u, p, r), rtol=1e-8, atol=1e-10)
            Y = sol.y.T
        Z[k + 1:stop + 1] = Y[1:stop - k + 1]
        base[k + 1:stop] = cmd
        z = Z[stop].copy()
        k = stop
    base[n - 1] = cmd
    return Z, base, anti


def default_inputs(t_s: np.ndarray, seed: int):
    """Feed steps every 2 h (0.02..0.08 L/h), aeration steps every hour (5..15 L/h), 30 W."""
    rng = np.random.default_rng(1000 + seed)
    b = (t_s // 7200).astype(int)
    feed = rng.uniform(0.02, 0.08, b.max() + 1)[b]
    a = (t_s // 3600).astype(int)
    air = rng.uniform(5.0, 15.0, a.max() + 1)[a]
    return feed, air, np.full(t_s.size, 30.0)


def run_table(r: Reality, hours: float, sample_s: float, seed: int):
    """One run as a pandas DataFrame of what the unit logs (column names of MAP_TOML), and
    the true states (n, NZ)."""
    import pandas as pd

    t_s = np.arange(0.0, hours * 3600.0 + 0.5 * sample_s, sample_s)
    feed, air, power = default_inputs(t_s, seed)
    Z, base, anti = simulate(r, t_s, feed, air, power)
    rng = np.random.default_rng(seed)
    n = t_s.size
    t_h = t_s / 3600.0
    do = 100.0 * Z[:, Z_C] / r.params["C_L_sat"] + r.do_drift_per_h * t_h + rng.normal(0, r.do_noise_pct, n)
    bio = Z[:, Z_X] + r.biomass_offset + r.biomass_drift_per_h * t_h + rng.normal(0, r.biomass_noise, n)
    lab = np.full(n, np.nan)
    glu_lab = np.full(n, np.nan)
    every = max(1, int(round(r.lab_every_h * 3600.0 / sample_s)))
    idx = np.arange(0, n, every)
    lab[idx] = Z[idx, Z_X] * (1.0 + r.lab_rel_noise * rng.standard_normal(idx.size))
    glu_lab[idx] = np.maximum(Z[idx, Z_S] * (1.0 + r.lab_rel_noise * rng.standard_normal(idx.size)), 0.0)
    df = pd.DataFrame({
        "t_s": t_s, "feed_rate": feed, "aeration_rate": air, "agitation_power": power, "base_flow": base,
        "dissolved_oxygen": do, "biomass": bio, "biomass_lab": lab, "glucose_lab": glu_lab,
        "co2": Z[:, Z_CO2] + rng.normal(0, r.co2_noise, n), "ph": Z[:, Z_PH] + rng.normal(0, r.ph_noise, n),
        "antifoam": anti})
    return df, Z


MAP_TOML = """\
# column map for hil.calibration.reality logs
[columns]
feed_rate = "feed_rate"
aeration_rate = "aeration_rate"
agitation_power = "agitation_power"
base_flow = "base_flow"
dissolved_oxygen = "dissolved_oxygen"
biomass = "biomass"
co2 = "co2"
ph = "ph"
biomass_lab = { to = "biomass", role = "reference" }
glucose_lab = "glucose"
antifoam = { role = "extra" }

# held by the unit's own controllers, not logged
[states.temperature]
value = 298.0
[states.h_ion]
value = 1e-5
"""


def write_runs(out_dir, r: Reality | None = None, runs: int = 3, hours: float = 48.0, sample_s: float = 10.0,
               first_seed: int = 0, gzip: bool = False) -> list[str]:
    """Write run<i>.csv[.gz] and map.toml into out_dir; returns the log paths."""
    from pathlib import Path

    r = r or Reality()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(first_seed, first_seed + runs):
        df, _ = run_table(r, hours, sample_s, i)
        f = out / (f"run{i}.csv" + (".gz" if gzip else ""))
        df.to_csv(f, index=False, float_format="%.6g")
        paths.append(str(f))
    (out / "map.toml").write_text(MAP_TOML)
    return paths


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hours", type=float, default=48.0)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--no-foam", action="store_true", help="switch the unmodelled foaming off")
    ap.add_argument("--gzip", action="store_true")
    a = ap.parse_args(argv)
    r = Reality(foam_rate_per_h=0.0 if a.no_foam else Reality().foam_rate_per_h)
    for p in write_runs(a.out, r, a.runs, a.hours, a.sample_s, gzip=a.gzip):
        print(p)


if __name__ == "__main__":
    main()
