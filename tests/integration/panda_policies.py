"""Entry policies for tests/integration/test_panda_policy.py (features: joint_1..7.q; actions:
joint_1..7.tau_target, gripper.width_target)."""

import numpy as np


def push_out(x):
    """Pushes joint 2 forward with 30 N m for ever: the TCP would leave the workspace box."""
    return np.array([0.0, 30.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.08])


def silent(x):
    """Never a finite answer: the safety's baseline (the joint PD) acts every step."""
    return np.full(8, np.nan)


def hold_still(x):
    """Zero torque on top of the drive's gravity compensation, gripper open (a policy that
    costs nothing: isolates the bus round trip from the policy's own compute)."""
    return np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.08])
