"""Fed-batch penicillin bioreactor: the PenSim model.

Source: G. Birol, C. Undey, A. Cinar (2002), "A modular simulation package for fed-batch
fermentation: penicillin production", Comput. Chem. Eng. 26:1553-1565 (PenSim v2.0), with
the growth and production kinetics of R.K. Bajpai and M. Reuss (1980), J. Chem. Technol.
Biotechnol. 30:332-344. Equation numbers below are Birol et al.'s; parameter values are
their Table 2, initial conditions their Table 3 (the PenSim defaults).

Time unit: hours, as in PenSim. `TIME_UNIT_S = 3600.0` seconds per plant time unit, so the
loop's 1 s period is `dt = 1 / 3600` here. All rates below are per hour.

Units (g/L for concentrations, the bioprocess convention, see CONVENTIONS.md):
- biomass X, glucose S, penicillin P: g/L; volume V: L; temperature T: K (state and output;
  degC only at the edges); heat Q: kcal (cumulative heat of reaction).
- dissolved oxygen C_L: mmol O2/L. Sources disagree on this unit (Birol et al. write g/L,
  others % saturation). With C_L in mmol/L every PenSim oxygen number is physically sensible:
  C_L* = 1.16 mmol/L (~0.9 bar O2 partial pressure at 25 degC), Y_x/o = 0.04 g/mmol (1.25 g
  biomass per g O2), m_o = 0.467 mmol/(g h) (15 mg O2/(g h)); read as g/L they are not
  (1.16 g/L is 40x the solubility of O2 in water). The equations do not change with the
  label. The DO output is in % of saturation: 100 * C_L / C_L*.
- CO2: mmol/L (PenSim eq. 18: CO2 evolved per litre of broth, served as the off-gas CO2
  signal). H+: mol/L; the pH output is -log10([H+]).
- Inputs: feed, base, acid, coolant and hot-water flows in L/h; aeration f_g in L/h (PenSim's
  unit and scale: 8.6 L/h for 100 L); agitation power P_w in W.

States (kernel order): X, S, P, C_L, V, CO2, [H+], T, Q.
Inputs: F (feed, s_f g/L glucose), F_b (base, C_b mol/L), F_a (acid, C_a mol/L), f_g, P_w,
F_c (cooling water at T_cool), F_h (hot water at T_hot).

Equations (readable pure Python; the Numba kernel is the same arithmetic, regrouped):

    R, T0, TV, KW = 1.987, 273.0, 373.0, 1e-14   # cal/(mol K), K, K, (mol/L)^2
    S_EPS, CL_EPS = 1e-3, 1e-2                   # g/L, mmol/L (maintenance shut-off)
    X_, S_, C_ = max(X, 0), max(S, 0), max(C_L, 0)
    F, F_b, F_a, f_g, P_w, F_c, F_h = (max(v, 0) for v in inputs)
    # kinetics (eqs. 2-4, 7, 10)
    mu_g = (mu_x / (1 + K_1/H + H/K_2) * S_/(K_x*X_ + S_) * C_/(K_ox*X_ + C_)
            * k_g*exp(-E_g/(R*T)))                       # growth, 1/h
    mu = mu_g - k_d*exp(-E_d/(R*T))                      # net of death, 1/h
    mu_pp = mu_p * S_/(K_p + S_ + S_**2/K_I) * C_**3/(K_op*X_ + C_**3)
    # transport (eqs. 13-15)
    kla = kla_alpha * sqrt(f_g) * (P_w/V)**kla_beta      # 1/h
    F_loss = V * lambda_evap * (exp(5*(T - T0)/(TV - T0)) - 1)   # evaporation, L/h
    dV = F + F_a + F_b - F_loss
    D = dV / V                                           # dilution rate, 1/h
    lim_S, lim_O = min(1, S_/S_EPS), min(1, C_/CL_EPS)
    # balances (eqs. 1, 9, 11, 12, 18)
    dX = (mu - D)*X
    dS = -(mu_g/Y_xs + mu_pp/Y_ps + m_x*lim_S)*X + F*s_f/V - D*S
    dP = mu_pp*X - K_hyd*P - D*P
    dC_L = -(mu_g/Y_xo + mu_pp/Y_po + m_o*lim_O)*X + kla*(C_L_sat - C_L) - D*C_L
    dCO2 = (alpha_1*mu_g + alpha_2)*X + alpha_3
    # pH (eqs. 5-6): excess strong base B = KW/H - H, H follows B through water equilibrium
    base = (C_b*F_b - C_a*F_a)/V - gamma*mu_g*X         # net base inflow, mol/(L h)
    dH = (H*(KW - H**2)*D - H**2*base) / (H**2 + KW)
    # heat (eqs. 16-17)
    Q_rxn = (r_q1*mu_g + r_q2)*X*V                       # cal/h
    UA = lambda F_, a: a*F_**(b_exch+1)/(F_ + a*F_**b_exch/(2*rho_c_cp_c)) if F_ > 0 else 0
    dT = (F*(T_feed - T) + (Q_rxn - UA(F_c, a_cool)*(T - T_cool)
                            + UA(F_h, a_heat)*(T_hot - T)) / rho_cp) / V
    dQ = Q_rxn / 1000                                    # kcal/h

Where this departs from the printed paper, and why:
- pH (eqs. 5-6). PenSim writes d[H+]/dt = gamma*(mu*X - F*X/V) + ([H+]_eq(B) - [H+])/dt_s
  with B = ((1e-14/[H+] - [H+])*V - C_ab*(F_a + F_b)*dt_s)/(V + (F_a + F_b)*dt_s) taken at
  the last sample: a relaxation with time constant dt_s (the controller's sample time) towards
  the equilibrium after one sample's acid/base, i.e. a stiff mode of rate 1/dt_s that a
  fixed-step RK4 follows only with h << dt_s. We take its dt_s -> 0 limit analytically. B is
  the excess strong base of the unbuffered broth (charge balance); d(B*V)/dt = C_b*F_b -
  C_a*F_a - gamma*mu_g*X*V (biomass formation releases gamma mol H+ per g; feed and
  evaporation carry no strong ions, so B is diluted/concentrated with D); and [H+] follows B
  through the water equilibrium, dH/dB = -H^2/(H^2 + KW). No relaxation time constant is left,
  [H+] stays positive (dH/dt -> 0 as H -> 0), and acid and base enter with opposite signs
  (PenSim's printed B adds them with the same sign). PenSim's -gamma*F*X/V term was the
  dilution of X inside dX/dt; dilution of B is explicit here.
- Growth vs death. Death (k_d*exp(-E_d/RT)) acts on X only, as in the authors' own code where
  it sits outside the Monod and pH factors. Consumption of glucose and O2, H+ release, CO2
  and heat follow the growth rate mu_g (PenSim: net mu, or dX/dt for CO2 and heat): with the
  net rate dying cells would return glucose and O2 and make CO2 negative (death is 2e-4 1/h
  at 298 K, so this is invisible there, but reaches ~60 1/h at 60 degC under full heating).
- Maintenance guard: PenSim's m_x*X and m_o*X go on consuming glucose and oxygen at zero
  concentration, driving S and C_L negative when the feed or the air stops. Below
  S_EPS = 1e-3 g/L and CL_EPS = 1e-2 mmol/L (0.9 % DO) maintenance ramps linearly to zero;
  above them the equations are PenSim's.
- Heat (eqs. 16-17): eq. 16 writes dQ_rxn/dt and eq. 17 uses Q_rxn as a rate; the authors'
  code uses it as a rate in cal/h, as here; the state Q is its integral (kcal).
  rho*C_p = 1500 and 2*rho_c*C_pc = 2000 cal/(L K) as in the authors' code (Table 2 prints
  reciprocals). Heating uses the same exchanger correlation with the authors' heating
  coefficient a = 8e5 cal/(h K), for a separate hot-water flow F_h at T_hot.
- Evaporation (eq. 15): lambda = 2.5e-4 1/h as in Table 2 (the authors' code uses 1e-4; the
  randomization range covers both). Acid and base flows add to the volume.
- Concentrations and flows are clipped at 0 where a negative value would make a rate
  singular or a sqrt/pow undefined; the clip keeps NaN (0.0 * NaN is NaN), so a NaN input or
  state still poisons the state instead of being hidden.

Stiffness and sub-steps. The fastest modes are the pH near neutrality (the titration curve
is steepest at pH 7: |dH'/dH| <= 0.65/sqrt(KW) * |net base inflow| <= 6.5e6 L/mol * 9.5e-4
mol/(L h) = 6.2e3 1/h with the pump at 10 mL/h of 3.3 M into 50 L plus growth acid) and the
DO at C_L -> 0 (kLa + m_o*X/CL_EPS + mu_g/(Y_xo*K_ox) <= 5.2e3 1/h), both at the corners of
the state, input and parameter boxes. With dt = 1 s (1/3600 h) and DEFAULT_SUBSTEPS = 1,
h*|lambda| <= 1.7, inside RK4's real-axis stability limit 2.785 (and RK4 keeps a decaying
mode positive at any h*lambda inside it). At such a corner one sub-step is stable but
coarse: crossing pH 7 at full dosing, [H+] is off by <= 1.5 % along the way (0.006 pH)
with 1 sub-step and 0.08 % with 2. Over the 24 h validation profile (time-varying feed,
acid/base, cooling, heating; tests/plants/test_bioreactor.py) 1 sub-step at dt = 1 s is
within 4e-12 (relative) of DOP853 at rtol 1e-13; LSODA at rtol 1e-11 is 9e-9 off (its own
error). Larger steps with 1 sub-step: dt = 10 s 4e-8, 60 s 6e-5 (2 sub-steps 4e-6), 300 s
unstable. Keep the sub-step <= 1.5 s for stability at the corners (n_sub >= dt / 1.5 s): this
is MAX_SUBSTEP, from which the loop derives its sub-step count (at 2 s, [H+] already turns
negative at some corners: tests/plants/test_bioreactor.py).

Parameters (Birol et al. 2002 Table 2 unless stated). The bounds in SPEC are the
randomization ranges: about +-30 % on kinetic constants, narrower on activation energies
(exponential sensitivity) and titrant/feed make-up.

    name         value          unit                     meaning
    mu_x         0.092          1/h                      max specific growth rate
    K_x          0.15           g/g                      Contois saturation constant (K_x*X)
    K_ox         2e-2           mmol/g                   O2 limitation constant, growth
    K_op         5e-4           (mmol/L)^3 L/g           O2 limitation constant, product
    mu_p         0.005          1/h                      specific penicillin production rate
    K_p          2e-4           g/L                      production saturation constant
    K_I          0.10           g/L                      substrate inhibition constant
    (p           3              -                        C_L exponent, fixed)
    K_hyd        0.04           1/h                      penicillin hydrolysis rate (K)
    k_g, E_g     7e3, 5100      -, cal/mol               growth Arrhenius constants
    k_d, E_d     1e33, 50000    1/h, cal/mol             death Arrhenius constants
    Y_xs         0.45           g/g                      biomass / glucose
    Y_xo         0.04           g/mmol                   biomass / O2
    Y_ps         0.90           g/g                      penicillin / glucose
    Y_po         0.20           g/mmol                   penicillin / O2
    m_x          0.014          g/(g h)                  glucose maintenance
    m_o          0.467          mmol/(g h)               O2 maintenance
    alpha_1      0.143          mmol/g                   CO2 per g biomass formed
    alpha_2      4e-7           mmol/(g h)               CO2 from maintenance
    alpha_3      1e-4           mmol/(L h)               CO2 background
    K_1, K_2     1e-10, 7e-5    mol/L                    pH dependence of growth
    gamma        1e-5           mol/g                    H+ released per g biomass formed
    C_L_sat      1.16           mmol/L                   O2 saturation C_L*
    kla_alpha    70             (1/h)(L/h)^-0.5(W/L)^-b  kLa = alpha*sqrt(f_g)*(P_w/V)^beta
    kla_beta     0.4            -
    lambda_evap  2.5e-4         1/h                      evaporation constant
    r_q1         60             cal/g                    heat of growth
    r_q2         1.6783e-4      cal/(g h)                maintenance heat
    rho_cp       1500           cal/(L K)                broth rho*C_p (code's 1/1500)
    rho_c_cp_c   1000           cal/(L K)                coolant rho_c*C_pc (code's 2000/2)
    a_cool       1000           cal/(h K)                exchanger coefficient, cooling
    a_heat       8e5            cal/(h K)                exchanger coefficient, heating (code)
    b_exch       0.60           -                        exchanger exponent b
    s_f          600            g/L                      glucose in the feed
    T_feed       296            K                        feed temperature
    T_cool       283.15         K                        cooling-water supply (not in Table 2)
    T_hot        313.15         K                        hot-water supply (not in Table 2)
    C_a, C_b     3, 3           mol/L                    acid / base strength
    constants: R = 1.987 cal/(mol K), T0 = 273 K, T_v = 373 K, K_w = 1e-14 (mol/L)^2.

Initial state (Table 3): X 0.1 g/L, S 15 g/L, P 0, C_L = C_L* = 1.16 mmol/L, V 100 L,
CO2 0.5 mmol/L, [H+] 1e-5 mol/L (pH 5), T 298 K, Q 0. Nominal inputs: PenSim's defaults
(F 0.042 L/h, f_g 8.6 L/h, P_w 30 W), no acid, base, cooling or heating.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from plants.panels import Panel
from plants.spec import PlantSpec, Quantity

TIME_UNIT_S = 3600.0
"""Seconds per plant time unit: the plant runs in hours (dt = period_s / TIME_UNIT_S)."""

DEFAULT_SUBSTEPS = 1
"""RK4 sub-steps per step at the nominal step dt = 1 s (1/3600 h); see module docstring."""

MAX_SUBSTEP = 1.5 / TIME_UNIT_S
"""Longest stable RK4 sub-step, h (= 1.5 s): h*|lambda| <= 2.6 < 2.785 at the stiffest
corner (pH near 7 at full dosing, DO near 0); the loop derives its sub-step count from it."""

# ---- physical constants (not randomized) ----
R_GAS = 1.987  # cal/(mol K)
T_FREEZE = 273.0  # K, eq. 15
T_BOIL = 373.0  # K, eq. 15
K_W = 1e-14  # (mol/L)^2, ion product of water
S_EPS = 1e-3  # g/L, glucose maintenance shut-off
CL_EPS = 1e-2  # mmol/L, O2 maintenance shut-off
_TINY = 1e-300  # keeps 0/0 at zero concentrations at 0; no effect on normal numbers

# ---- state indices ----
X_BIOMASS, X_GLUCOSE, X_PENICILLIN, X_DO, X_VOLUME, X_CO2, X_H, X_TEMP, X_HEAT = range(9)
# ---- input indices ----
U_FEED, U_BASE, U_ACID, U_AIR, U_POWER, U_COOL, U_HOT = range(7)
# ---- output indices ----
(Y_GLUCOSE, Y_DO, Y_PH, Y_TEMP, Y_BIOMASS, Y_VOLUME, Y_CO2, Y_PENICILLIN, Y_HEAT) = range(9)
# ---- parameter indices ----
(
    P_MU_X, P_K_X, P_K_OX, P_K_OP, P_MU_P, P_K_P, P_K_I, P_K_HYD,
    P_K_G, P_E_G, P_K_D, P_E_D,
    P_Y_XS, P_Y_XO, P_Y_PS, P_Y_PO, P_M_X, P_M_O,
    P_ALPHA_1, P_ALPHA_2, P_ALPHA_3, P_K_1, P_K_2, P_GAMMA,
    P_CL_SAT, P_KLA_ALPHA, P_KLA_BETA, P_LAMBDA,
    P_R_Q1, P_R_Q2, P_RHO_CP, P_RHO_C_CP_C, P_A_COOL, P_A_HEAT, P_B_EXCH,
    P_S_F, P_T_FEED, P_T_COOL, P_T_HOT, P_C_A, P_C_B,
) = range(41)

Q = Quantity
SPEC = PlantSpec(
    name="bioreactor",
    description="PenSim fed-batch penicillin fermentation (Birol, Undey, Cinar 2002), time in h",
    states=(
        Q("biomass", "g/L", 0.1, 0.0, 60.0, "biomass X"),
        Q("glucose", "g/L", 15.0, 0.0, 600.0, "glucose S (cannot exceed the feed's s_f)"),
        Q("penicillin", "g/L", 0.0, 0.0, 20.0, "penicillin P"),
        Q("dissolved_o2", "mmol/L", 1.16, 0.0, 2.0, "dissolved oxygen C_L"),
        Q("volume", "L", 100.0, 50.0, 150.0, "broth volume V (vessel: impeller covered..full)"),
        Q("co2", "mmol/L", 0.5, 0.0, 50.0, "CO2 evolved (PenSim eq. 18)"),
        Q("h_ion", "mol/L", 1e-5, 1e-12, 1e-2, "H+ concentration (pH 2..12)"),
        Q("temperature", "K", 298.0, 273.15, 373.15, "broth temperature T"),
        Q("heat", "kcal", 0.0, 0.0, 1e5, "cumulative heat of reaction"),
    ),
    inputs=(
        Q("feed_rate", "L/h", 0.042, 0.0, 0.5, "glucose feed F (s_f g/L)"),
        Q("base_flow", "L/h", 0.0, 0.0, 0.01, "base addition F_b (C_b mol/L)"),
        Q("acid_flow", "L/h", 0.0, 0.0, 0.01, "acid addition F_a (C_a mol/L)"),
        Q("aeration_rate", "L/h", 8.6, 0.0, 30.0, "aeration f_g"),
        Q("agitation_power", "W", 30.0, 0.0, 100.0, "agitator power P_w"),
        Q("coolant_flow", "L/h", 0.0, 0.0, 1000.0, "cooling water F_c at T_cool"),
        Q("heating_flow", "L/h", 0.0, 0.0, 100.0, "hot water F_h at T_hot"),
    ),
    outputs=(
        Q("glucose", "g/L", 15.0, 0.0, 600.0, "glucose S"),
        Q("dissolved_oxygen", "%", 100.0, 0.0, 150.0,
          "DO, % of saturation C_L* (above 100 only if C_L* is lowered under a saturated broth)"),
        Q("ph", "pH", 5.0, 2.0, 12.0, "-log10[H+]"),
        Q("temperature", "K", 298.0, 273.15, 373.15, "broth temperature"),
        Q("biomass", "g/L", 0.1, 0.0, 60.0, "biomass X"),
        Q("volume", "L", 100.0, 50.0, 150.0, "broth volume"),
        Q("co2", "mmol/L", 0.5, 0.0, 50.0, "CO2 evolved (off-gas CO2 signal)"),
        Q("penicillin", "g/L", 0.0, 0.0, 20.0, "penicillin P"),
        Q("heat", "kcal", 0.0, 0.0, 1e5, "cumulative heat of reaction"),
    ),
    params=(
        Q("mu_x", "1/h", 0.092, 0.065, 0.12, "max specific growth rate"),
        Q("K_x", "g/g", 0.15, 0.1, 0.2, "Contois saturation constant"),
        Q("K_ox", "mmol/g", 2e-2, 0.014, 0.026, "O2 limitation constant, growth"),
        Q("K_op", "(mmol/L)^3 L/g", 5e-4, 3.5e-4, 6.5e-4, "O2 limitation constant, product"),
        Q("mu_p", "1/h", 0.005, 0.0035, 0.0065, "specific penicillin production rate"),
        Q("K_p", "g/L", 2e-4, 1.4e-4, 2.6e-4, "production saturation constant"),
        Q("K_I", "g/L", 0.10, 0.07, 0.13, "substrate inhibition constant, production"),
        Q("K_hyd", "1/h", 0.04, 0.028, 0.052, "penicillin hydrolysis rate"),
        Q("k_g", "1", 7e3, 4.9e3, 9.1e3, "growth Arrhenius constant"),
        Q("E_g", "cal/mol", 5100.0, 5000.0, 5200.0, "growth activation energy"),
        Q("k_d", "1/h", 1e33, 7e32, 1.3e33, "death Arrhenius constant"),
        Q("E_d", "cal/mol", 50000.0, 49500.0, 50500.0, "death activation energy"),
        Q("Y_xs", "g/g", 0.45, 0.35, 0.55, "yield biomass/glucose"),
        Q("Y_xo", "g/mmol", 0.04, 0.03, 0.05, "yield biomass/O2"),
        Q("Y_ps", "g/g", 0.90, 0.7, 1.0, "yield penicillin/glucose"),
        Q("Y_po", "g/mmol", 0.20, 0.15, 0.25, "yield penicillin/O2"),
        Q("m_x", "g/(g h)", 0.014, 0.01, 0.018, "glucose maintenance coefficient"),
        Q("m_o", "mmol/(g h)", 0.467, 0.33, 0.6, "O2 maintenance coefficient"),
        Q("alpha_1", "mmol/g", 0.143, 0.1, 0.19, "CO2 per biomass formed"),
        Q("alpha_2", "mmol/(g h)", 4e-7, 2.8e-7, 5.2e-7, "CO2 from maintenance"),
        Q("alpha_3", "mmol/(L h)", 1e-4, 7e-5, 1.3e-4, "CO2 background rate"),
        Q("K_1", "mol/L", 1e-10, 5e-11, 2e-10, "pH constant of growth, alkaline side"),
        Q("K_2", "mol/L", 7e-5, 3.5e-5, 1.4e-4, "pH constant of growth, acid side"),
        Q("gamma", "mol/g", 1e-5, 7e-6, 1.3e-5, "H+ released per g biomass formed"),
        Q("C_L_sat", "mmol/L", 1.16, 0.8, 1.3, "O2 saturation concentration C_L*"),
        Q("kla_alpha", "(1/h)(L/h)^-0.5(W/L)^-beta", 70.0, 49.0, 91.0, "kLa prefactor"),
        Q("kla_beta", "1", 0.4, 0.35, 0.45, "kLa exponent on P_w/V"),
        Q("lambda_evap", "1/h", 2.5e-4, 1e-4, 4e-4, "evaporation constant"),
        Q("r_q1", "cal/g", 60.0, 42.0, 78.0, "heat of growth per g biomass"),
        Q("r_q2", "cal/(g h)", 1.6783e-4, 1.17e-4, 2.18e-4, "maintenance heat"),
        Q("rho_cp", "cal/(L K)", 1500.0, 1000.0, 1600.0, "broth density x heat capacity"),
        Q("rho_c_cp_c", "cal/(L K)", 1000.0, 950.0, 1050.0, "coolant density x heat capacity"),
        Q("a_cool", "cal/(h K)", 1000.0, 700.0, 1300.0, "exchanger coefficient, cooling"),
        Q("a_heat", "cal/(h K)", 8e5, 5.6e5, 1.04e6, "exchanger coefficient, heating"),
        Q("b_exch", "1", 0.60, 0.5, 0.7, "exchanger exponent b"),
        Q("s_f", "g/L", 600.0, 500.0, 700.0, "glucose concentration in the feed"),
        Q("T_feed", "K", 296.0, 291.0, 301.0, "feed temperature"),
        Q("T_cool", "K", 283.15, 278.15, 288.15, "coolant supply temperature"),
        Q("T_hot", "K", 313.15, 308.15, 323.15, "hot-water supply temperature"),
        Q("C_a", "mol/L", 3.0, 2.7, 3.3, "acid concentration"),
        Q("C_b", "mol/L", 3.0, 2.7, 3.3, "base concentration"),
    ),
)

# the dashboard's default panels (plants/panels.py): what the operator of a fed-batch watches
PANELS = (
    Panel("Dissolved oxygen", ("dissolved_oxygen", "agitation_power")),
    Panel("Glucose and feed", ("glucose", "feed_rate")),
    Panel("pH", ("ph", "base_flow")),
)
del Q


@njit(cache=True, nogil=True, inline="always")
def _pos(v):
    """max(v, 0) that keeps NaN (0.0 * NaN is NaN)."""
    return v if v > 0.0 else 0.0 * v


@njit(cache=True, nogil=True, inline="always")
def _exchanger_ua(flow, a, b, rho_c_cp_c):
    """PenSim eq. 17 heat-exchange coefficient a*F^(b+1)/(F + a*F^b/(2 rho_c C_pc)), cal/(h K)."""
    if flow > 0.0:
        fb = flow**b
        return a * fb * flow / (flow + a * fb / (2.0 * rho_c_cp_c))
    return 0.0 * flow  # no flow (or a negative command): no exchange; NaN stays NaN


@njit(cache=True, nogil=True)
def derivatives(t, x, u, p, dxdt):
    """PenSim right-hand side (module docstring); time in h, writes dxdt in place.

    Written for speed: one reciprocal of V, Monod fractions merged over a common
    denominator (11 divisions, 3 exp, 1 pow, 1 sqrt per call, ~60 ns).
    """
    X = x[X_BIOMASS]
    S = x[X_GLUCOSE]
    P = x[X_PENICILLIN]
    C = x[X_DO]
    V = x[X_VOLUME]
    H = x[X_H]
    T = x[X_TEMP]
    F = _pos(u[U_FEED])
    f_base = _pos(u[U_BASE])
    f_acid = _pos(u[U_ACID])
    xp = _pos(X)
    sp = _pos(S)
    cp = _pos(C)
    iv = 1.0 / V

    # kinetics: growth (eqs. 2-4), death, production (eq. 10)
    inv_rt = 1.0 / (R_GAS * T)
    k_2 = p[P_K_2]
    ph_factor = H * k_2 / (H * (k_2 + H) + p[P_K_1] * k_2)  # 1/(1 + K_1/H + H/K_2)
    monod = sp * cp / ((p[P_K_X] * xp + sp) * (p[P_K_OX] * xp + cp) + _TINY)
    mu_g = p[P_MU_X] * ph_factor * monod * p[P_K_G] * math.exp(-p[P_E_G] * inv_rt)
    mu = mu_g - p[P_K_D] * math.exp(-p[P_E_D] * inv_rt)
    k_i = p[P_K_I]
    c3 = cp * cp * cp
    mu_pp = (p[P_MU_P] * sp * k_i * c3
             / ((k_i * (p[P_K_P] + sp) + sp * sp) * (p[P_K_OP] * xp + c3) + _TINY))
    # transport (eqs. 13-15)
    kla = p[P_KLA_ALPHA] * math.sqrt(_pos(u[U_AIR])) * (_pos(u[U_POWER]) * iv) ** p[P_KLA_BETA]
    f_loss = V * p[P_LAMBDA] * (math.exp(5.0 * (T - T_FREEZE) / (T_BOIL - T_FREEZE)) - 1.0)
    dV = F + f_acid + f_base - f_loss
    D = dV * iv
    lim_s = sp / S_EPS if sp < S_EPS else 1.0
    lim_o = cp / CL_EPS if cp < CL_EPS else 1.0

    dxdt[X_BIOMASS] = (mu - D) * X
    dxdt[X_GLUCOSE] = (
        -(mu_g / p[P_Y_XS] + mu_pp / p[P_Y_PS] + p[P_M_X] * lim_s) * X + F * p[P_S_F] * iv - D * S
    )
    dxdt[X_PENICILLIN] = mu_pp * X - (p[P_K_HYD] + D) * P
    dxdt[X_DO] = (
        -(mu_g / p[P_Y_XO] + mu_pp / p[P_Y_PO] + p[P_M_O] * lim_o) * X
        + kla * (p[P_CL_SAT] - C)
        - D * C
    )
    dxdt[X_VOLUME] = dV
    dxdt[X_CO2] = (p[P_ALPHA_1] * mu_g + p[P_ALPHA_2]) * X + p[P_ALPHA_3]

    # pH: excess strong base B = Kw/H - H, d(BV)/dt = net base in, dH/dB = -H^2/(H^2 + Kw).
    base = (p[P_C_B] * f_base - p[P_C_A] * f_acid) * iv - p[P_GAMMA] * mu_g * X
    h2 = H * H
    inv = 1.0 / (h2 + K_W)
    dxdt[X_H] = (H * (K_W - h2) * D - h2 * base) * inv

    # heat (eqs. 16-17)
    q_rxn = (p[P_R_Q1] * mu_g + p[P_R_Q2]) * X * V  # cal/h
    ua_c = _exchanger_ua(u[U_COOL], p[P_A_COOL], p[P_B_EXCH], p[P_RHO_C_CP_C])
    ua_h = _exchanger_ua(u[U_HOT], p[P_A_HEAT], p[P_B_EXCH], p[P_RHO_C_CP_C])
    dxdt[X_TEMP] = (
        F * (p[P_T_FEED] - T)
        + (q_rxn - ua_c * (T - p[P_T_COOL]) + ua_h * (p[P_T_HOT] - T)) / p[P_RHO_CP]
    ) * iv
    dxdt[X_HEAT] = q_rxn * 1e-3


@njit(cache=True, nogil=True)
def outputs(x, u, p, y):
    """True (noise-free) measurements: see SPEC.outputs for names and units."""
    y[Y_GLUCOSE] = x[X_GLUCOSE]
    y[Y_DO] = 100.0 * x[X_DO] / p[P_CL_SAT]
    y[Y_PH] = -math.log10(x[X_H]) if x[X_H] > 0.0 else math.nan
    y[Y_TEMP] = x[X_TEMP]
    y[Y_BIOMASS] = x[X_BIOMASS]
    y[Y_VOLUME] = x[X_VOLUME]
    y[Y_CO2] = x[X_CO2]
    y[Y_PENICILLIN] = x[X_PENICILLIN]
    y[Y_HEAT] = x[X_HEAT]


@njit(cache=True, nogil=True)
def step(t, x, u, p, dt, n_sub, work):
    """Advance x in place by dt hours (inputs held), n_sub RK4 sub-steps; returns t + dt.

    Classical RK4, written out here so that `derivatives` is a plain global call and the
    compiled kernel is cached across processes (a dispatcher passed as an argument is
    not); tests check it against plants.integrators.rk4_step bit for bit.
    """
    k1 = work[0]
    k2 = work[1]
    k3 = work[2]
    k4 = work[3]
    tmp = work[4]
    n = x.size
    h = dt / n_sub
    for s in range(n_sub):
        ts = t + s * h
        derivatives(ts, x, u, p, k1)
        for i in range(n):
            tmp[i] = x[i] + 0.5 * h * k1[i]
        derivatives(ts + 0.5 * h, tmp, u, p, k2)
        for i in range(n):
            tmp[i] = x[i] + 0.5 * h * k2[i]
        derivatives(ts + 0.5 * h, tmp, u, p, k3)
        for i in range(n):
            tmp[i] = x[i] + h * k3[i]
        derivatives(ts + h, tmp, u, p, k4)
        for i in range(n):
            x[i] += (h / 6.0) * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i])
    return t + dt


@njit(cache=True, nogil=True, parallel=True)
def run_batch(t, X, U, P, dt, n_sub, n_steps):
    """Advance N instances (rows of X, U, P) by n_steps steps of dt hours each, in parallel."""
    for j in prange(X.shape[0]):
        work = np.empty((5, X.shape[1]))
        tj = t
        for _ in range(n_steps):
            tj = step(tj, X[j], U[j], P[j], dt, n_sub, work)
