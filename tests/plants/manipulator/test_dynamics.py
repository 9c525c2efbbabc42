"""ABA, RNEA and kinematics of the shipped Panda against Pinocchio (test extra `pin`).

Tolerances: 1e-9 absolute on accelerations (rad/s^2) for 1000 random states, as the issue
asks; both sides are double-precision recursive algorithms on the same model, and the
measured gap is ~1e-11 (round-off of a 7-body recursion with accelerations up to ~1e3).
"""

import numpy as np
import pytest

pin = pytest.importorskip("pinocchio")

from plants.manipulator.chain import PANDA_LOCK, PANDA_TCP, PANDA_URDF, Chain, load_panda  # noqa: E402

N_STATES = 1000


@pytest.fixture(scope="module")
def pin_model():
    full = pin.buildModelFromUrdf(str(PANDA_URDF))
    lock = [full.getJointId(n) for n in PANDA_LOCK]
    q_lock = pin.neutral(full)
    for n, val in PANDA_LOCK.items():
        q_lock[full.joints[full.getJointId(n)].idx_q] = val
    model = pin.buildReducedModel(full, lock, q_lock)
    return model


@pytest.fixture(scope="module")
def chain():
    return Chain(load_panda())


def random_states(tree, n, seed):
    rng = np.random.default_rng(seed)
    q = rng.uniform(tree.q_lower, tree.q_upper, (n, tree.nb))
    dq = rng.uniform(-1.5, 1.5, (n, tree.nb)) * tree.velocity_limit
    tau = rng.uniform(-1.0, 1.0, (n, tree.nb)) * tree.effort_limit
    return q, dq, tau


def test_panda_tree_has_seven_revolute_joints_with_the_real_masses(chain):
    tree = chain.tree
    assert tree.joint_names == tuple(f"panda_joint{i}" for i in range(1, 8))
    assert (tree.joint_type == 0).all()
    # link1..link6 as in the URDF; body 7 = link7 + hand (0.73) + two fingers (0.015 each)
    np.testing.assert_allclose(tree.mass[:6], [4.970684, 0.646926, 3.228604, 3.587895, 1.225946, 1.666555])
    assert tree.mass[6] == pytest.approx(0.735522 + 0.73 + 2 * 0.015)
    assert tree.frame(PANDA_TCP)[0] == 6
    np.testing.assert_allclose(tree.effort_limit, [87, 87, 87, 87, 12, 12, 12])


def test_aba_matches_pinocchio_on_1000_random_states(chain, pin_model):
    data = pin_model.createData()
    q, dq, tau = random_states(chain.tree, N_STATES, seed=1)
    ddq = np.zeros(chain.nb)
    worst = 0.0
    for k in range(N_STATES):
        ref = pin.aba(pin_model, data, q[k], dq[k], tau[k])
        chain.aba(q[k], dq[k], tau[k], ddq)
        worst = max(worst, float(np.abs(ddq - ref).max()))
    assert worst < 1e-9


def test_aba_batch_equals_one_call_per_state_and_pinocchio(chain, pin_model):
    data = pin_model.createData()
    q, dq, tau = random_states(chain.tree, 50, seed=3)
    DDQ = np.full((50, chain.nb), np.nan)
    chain.aba_batch(q, dq, tau, DDQ)
    one = np.zeros(chain.nb)
    for k in range(50):
        np.testing.assert_array_equal(DDQ[k], chain.aba(q[k], dq[k], tau[k], one))  # same kernel, bit for bit
        assert np.abs(DDQ[k] - pin.aba(pin_model, data, q[k], dq[k], tau[k])).max() < 1e-9


def test_packed_call_is_the_same_kernel_on_the_same_arrays():
    from plants.manipulator import dynamics as dyn

    ch = Chain(load_panda(), armature=np.linspace(0.1, 0.7, 7), gravity=np.array([0.3, -0.2, -9.7]))
    q, dq, tau = random_states(ch.tree, 20, seed=4)
    ch.f_ext[6] = [0.1, -0.2, 0.3, 4.0, -5.0, 6.0]  # written through the named view
    w = ch.ws
    for k in range(20):
        packed = ch.aba(q[k], dq[k], tau[k], np.zeros(7))  # no f_ext given: the 7-argument call
        ref = np.zeros(7)
        dyn.aba(ch.parent, ch.jtype, ch.E_tree, ch.r_tree, ch.inertia, ch.armature, ch.gravity, q[k], dq[k], tau[k],
                ch.f_ext.copy(), ref, w.E, w.r, w.v, w.c, w.pA, w.IA, w.U, w.D, w.u, w.acc, ch.T, ch.tmp)
        np.testing.assert_array_equal(packed, ref)
    # the named arrays are views of the packed buffers
    assert np.shares_memory(ch.f_ext, ch.model_f) and np.shares_memory(ch.gravity, ch.model_f)
    assert np.shares_memory(w.IA, w.buf) and np.shares_memory(ch.T, w.buf)
    assert ch.model_f.size == dyn.packed_size(7, dyn.MODEL_LAYOUT, dyn.MODEL_TAIL)


def test_one_buffer_call_is_the_same_kernel_bit_for_bit_and_checks_sizes():
    """dyn.aba_buf (5 arguments, pointer views) = aba_packed = aba on the same model, bit for bit."""
    from plants.manipulator import dynamics as dyn

    ch = Chain(load_panda(), armature=np.linspace(0.1, 0.7, 7), gravity=np.array([0.3, -0.2, -9.7]))
    ch.f_ext[6] = [0.1, -0.2, 0.3, 4.0, -5.0, 6.0]
    q, dq, tau = random_states(ch.tree, 20, seed=6)
    assert ch.buf.size == dyn.buffer_size(7)
    assert np.shares_memory(ch.model_i, ch.buf) and np.shares_memory(ch.f_ext, ch.buf)
    assert np.shares_memory(ch.ws.IA, ch.buf)
    for k in range(20):
        one, packed = np.zeros(7), np.zeros(7)
        dyn.aba_buf(ch.buf, q[k], dq[k], tau[k], one)
        dyn.aba_packed(ch.model_i, ch.model_f, ch.ws.buf, q[k], dq[k], tau[k], packed)
        np.testing.assert_array_equal(one, packed)
        np.testing.assert_array_equal(one, ch.aba(q[k], dq[k], tau[k], np.zeros(7), f_ext=ch.f_ext.copy()))
    with pytest.raises(ValueError, match="nb values"):
        dyn.aba_buf(ch.buf, q[0], dq[0], tau[0], np.zeros(6))  # ddq one short
    with pytest.raises(ValueError, match="buffer_size"):
        dyn.aba_buf(ch.buf[:-1], q[0], dq[0], tau[0], np.zeros(7))
    with pytest.raises(ValueError, match="buffer_size"):
        dyn.carve_buffer(np.zeros(10), 7)


def test_a_non_finite_input_still_reaches_ddq(chain):
    """aba is compiled with fast-math flags that assume nothing about NaN/inf (ABA_FASTMATH)."""
    from plants.manipulator import dynamics as dyn

    assert not {"nnan", "ninf", "fast"} & set(dyn.ABA_FASTMATH)
    q, dq, tau = random_states(chain.tree, 1, seed=5)
    for arr, val in ((q, np.nan), (dq, np.inf), (tau, np.nan)):
        a = arr[0].copy()
        arr[0, 3] = val
        ddq = chain.aba(q[0], dq[0], tau[0], np.zeros(chain.nb))
        arr[0] = a
        assert not np.isfinite(ddq).all()


def test_aba_matches_the_crba_rnea_route(chain, pin_model):
    """Second reference: ddq = M^-1 (tau - C dq - g) with Pinocchio's CRBA and RNEA."""
    data = pin_model.createData()
    q, dq, tau = random_states(chain.tree, 200, seed=2)
    ddq = np.zeros(chain.nb)
    worst = 0.0
    for k in range(200):
        M = pin.crba(pin_model, data, q[k])
        M = np.triu(M) + np.triu(M, 1).T
        nle = pin.rnea(pin_model, data, q[k], dq[k], np.zeros(chain.nb))
        ref = np.linalg.solve(M, tau[k] - nle)
        chain.aba(q[k], dq[k], tau[k], ddq)
        worst = max(worst, float(np.abs(ddq - ref).max()))
    assert worst < 1e-8  # a dense solve of M (condition number ~1e3) adds its own round-off


def test_armature_is_added_to_the_mass_matrix_diagonal(pin_model):
    armature = np.array([0.3, 0.3, 0.3, 0.3, 0.1, 0.1, 0.1])
    chain = Chain(load_panda(), armature=armature)
    model = pin_model.copy()
    model.armature = armature.copy()
    data = model.createData()
    q, dq, tau = random_states(chain.tree, 100, seed=3)
    ddq = np.zeros(chain.nb)
    tau_back = np.zeros(chain.nb)
    for k in range(100):
        chain.aba(q[k], dq[k], tau[k], ddq)
        np.testing.assert_allclose(ddq, pin.aba(model, data, q[k], dq[k], tau[k]), atol=1e-9, rtol=0)
        chain.rnea(q[k], dq[k], ddq, tau_back)
        np.testing.assert_allclose(tau_back, tau[k], atol=1e-9, rtol=0)


def test_external_force_on_the_last_body(chain, pin_model):
    data = pin_model.createData()
    q, dq, tau = random_states(chain.tree, 50, seed=4)
    rng = np.random.default_rng(5)
    ddq = np.zeros(chain.nb)
    for k in range(50):
        f = np.zeros((chain.nb, 6))
        f[6] = rng.normal(0, 10, 6)
        # Pinocchio's fext is [linear; angular] in the joint frame; ours [angular; linear] in
        # body coordinates: same frame here (the last joint's axis is already z).
        fext = [pin.Force.Zero() for _ in range(pin_model.njoints)]
        fext[7] = pin.Force(f[6, 3:], f[6, :3])
        ref = pin.aba(pin_model, data, q[k], dq[k], tau[k], fext)
        chain.aba(q[k], dq[k], tau[k], ddq, f)
        np.testing.assert_allclose(ddq, ref, atol=1e-9, rtol=0)


def test_rnea_and_gravity_match_pinocchio(chain, pin_model):
    data = pin_model.createData()
    q, dq, _ = random_states(chain.tree, 100, seed=6)
    rng = np.random.default_rng(7)
    tau = np.zeros(chain.nb)
    for k in range(100):
        ddq = rng.normal(0, 5, chain.nb)
        chain.rnea(q[k], dq[k], ddq, tau)
        np.testing.assert_allclose(tau, pin.rnea(pin_model, data, q[k], dq[k], ddq), atol=1e-9, rtol=0)
        chain.gravity_torque(q[k], tau)
        np.testing.assert_allclose(tau, pin.computeGeneralizedGravity(pin_model, data, q[k]), atol=1e-9, rtol=0)


def test_end_effector_position_and_jacobian_match_pinocchio(chain, pin_model):
    data = pin_model.createData()
    fid = pin_model.getFrameId(PANDA_TCP)
    q, _, _ = random_states(chain.tree, 100, seed=8)
    pos = np.zeros(3)
    J = np.zeros((6, chain.nb))
    for k in range(100):
        chain.frame(PANDA_TCP, q[k], pos, J)
        pin.forwardKinematics(pin_model, data, q[k])
        pin.updateFramePlacements(pin_model, data)
        np.testing.assert_allclose(pos, data.oMf[fid].translation, atol=1e-12)
        Jref = pin.computeFrameJacobian(pin_model, data, q[k], fid, pin.LOCAL_WORLD_ALIGNED)
        np.testing.assert_allclose(J[:3], Jref[3:], atol=1e-12)   # angular
        np.testing.assert_allclose(J[3:], Jref[:3], atol=1e-12)   # linear


def test_scaled_links_match_pinocchio_with_the_same_scaling(pin_model):
    """Domain randomization of link masses (mass and inertia scaled together) stays a valid
    rigid body: the arm plant's ABA (inside `evaluate`) equals Pinocchio on the scaled model."""
    from plants.manipulator.arm import ArmModel, evaluate

    arm = ArmModel.panda()
    scale = np.array([0.8, 1.2, 0.9, 1.1, 1.3, 0.7, 1.05])
    arm.scale_links(scale)
    arm.ps("coulomb")[:] = 0.0
    arm.ps("stribeck")[:] = 0.0
    arm.ps("viscous")[:] = 0.0
    arm.ps("gravity_comp")[:] = 0.0
    model = pin_model.copy()
    for i in range(7):
        model.inertias[i + 1] = pin.Inertia(model.inertias[i + 1].mass * scale[i], model.inertias[i + 1].lever,
                                            model.inertias[i + 1].inertia * scale[i])
    model.armature = arm.ps("rotor_inertia") * arm.ps("gear_ratio") ** 2
    data = model.createData()
    q, dq, tau = random_states(arm.tree, 50, seed=9)
    for k in range(50):
        arm.xs("q")[:] = q[k]
        arm.xs("dq")[:] = dq[k]
        arm.xs("tau_motor")[:] = tau[k]
        evaluate(arm.x, arm.u, arm.p, arm.model, arm.work, arm.gq)
        np.testing.assert_allclose(arm.work[15], pin.aba(model, data, q[k], dq[k], tau[k]), atol=1e-9, rtol=0)
    with pytest.raises(ValueError, match="mass_scale"):
        arm.scale_links(np.r_[scale[:6], -1.0])
