"""URDF reader: joint types, arbitrary axes, fixed and locked links, errors that name the element."""

import numpy as np
import pytest

from plants.manipulator.chain import Chain
from plants.manipulator.urdf import URDFError, parse_urdf, read_urdf

import xml.etree.ElementTree as ET

# A small tree with what the Panda does not exercise: tilted axes, a prismatic joint, a
# continuous joint, a fixed link carrying mass, an inertial with its own rpy, a locked joint.
TOY = """<robot name="toy">
  <link name="base"/>
  <link name="a"><inertial><origin xyz="0.1 0.02 -0.03" rpy="0.2 -0.1 0.3"/><mass value="2.0"/>
    <inertia ixx="0.02" ixy="0.001" ixz="-0.002" iyy="0.03" iyz="0.0005" izz="0.015"/></inertial></link>
  <link name="b"><inertial><origin xyz="0 0.1 0"/><mass value="1.0"/>
    <inertia ixx="0.01" ixy="0" ixz="0" iyy="0.004" iyz="0" izz="0.01"/></inertial></link>
  <link name="bfix"><inertial><origin xyz="0.05 0 0"/><mass value="0.5"/>
    <inertia ixx="0.001" ixy="0" ixz="0" iyy="0.001" iyz="0" izz="0.001"/></inertial></link>
  <link name="c"><inertial><origin xyz="0 0 0.05"/><mass value="0.7"/>
    <inertia ixx="0.003" ixy="0.0002" ixz="0" iyy="0.002" iyz="0" izz="0.001"/></inertial></link>
  <link name="locked"><inertial><origin xyz="0 0 0.02"/><mass value="0.2"/>
    <inertia ixx="0.0001" ixy="0" ixz="0" iyy="0.0001" iyz="0" izz="0.0001"/></inertial></link>
  <link name="d"><inertial><origin xyz="0.03 0 0"/><mass value="0.3"/>
    <inertia ixx="0.0004" ixy="0" ixz="0" iyy="0.0005" iyz="0" izz="0.0003"/></inertial></link>
  <joint name="j1" type="revolute"><parent link="base"/><child link="a"/>
    <origin xyz="0 0 0.2" rpy="0.1 0.2 0.3"/><axis xyz="1 1 0"/><limit lower="-2" upper="2" effort="50" velocity="2"/></joint>
  <joint name="j2" type="prismatic"><parent link="a"/><child link="b"/>
    <origin xyz="0.3 0 0" rpy="0 0.5 0"/><axis xyz="0 1 0"/><limit lower="-0.2" upper="0.2" effort="100" velocity="1"/></joint>
  <joint name="fix" type="fixed"><parent link="b"/><child link="bfix"/><origin xyz="0 0.2 0" rpy="0 0 1.0"/></joint>
  <joint name="j3" type="continuous"><parent link="bfix"/><child link="c"/>
    <origin xyz="0.1 0 0" rpy="-0.4 0 0"/><axis xyz="0 0 -1"/></joint>
  <joint name="lk" type="revolute"><parent link="c"/><child link="locked"/>
    <origin xyz="0 0 0.1"/><axis xyz="0 1 0"/><limit lower="-1" upper="1" effort="5" velocity="1"/></joint>
  <joint name="j4" type="revolute"><parent link="locked"/><child link="d"/>
    <origin xyz="0 0 0.05"/><axis xyz="0 0 1"/><limit lower="-1" upper="1" effort="5" velocity="1"/></joint>
</robot>"""


def test_toy_tree_layout():
    tree = parse_urdf(ET.fromstring(TOY), lock={"lk": 0.4})
    assert tree.joint_names == ("j1", "j2", "j3", "j4")
    assert list(tree.joint_type) == [0, 1, 0, 0]
    assert list(tree.parent) == [-1, 0, 1, 2]
    assert tree.mass[1] == pytest.approx(1.5)       # b + bfix welded
    assert tree.mass[2] == pytest.approx(0.9)       # c + locked welded
    assert tree.q_lower[2] == -np.inf               # continuous
    assert tree.frame("bfix")[0] == 1


def test_toy_tree_dynamics_match_pinocchio():
    pin = pytest.importorskip("pinocchio")
    full = pin.buildModelFromXML(TOY)
    jid = full.getJointId("lk")
    q_lock = pin.neutral(full)
    q_lock[full.joints[jid].idx_q] = 0.4
    model = pin.buildReducedModel(full, [jid], q_lock)
    data = model.createData()
    chain = Chain(parse_urdf(ET.fromstring(TOY), lock={"lk": 0.4}))
    rng = np.random.default_rng(0)
    ddq = np.zeros(4)
    pos = np.zeros(3)
    J = np.zeros((6, 4))
    fid = model.getFrameId("d")
    for _ in range(200):
        # pin's continuous joint is (cos, sin) in q: build its configuration from angles
        ang = rng.uniform(-1.5, 1.5, 4)
        ang[1] = rng.uniform(-0.2, 0.2)
        qp = np.array([ang[0], ang[1], np.cos(ang[2]), np.sin(ang[2]), ang[3]])
        dq = rng.normal(0, 2, 4)
        tau = rng.normal(0, 10, 4)
        ref = pin.aba(model, data, qp, dq, tau)
        chain.aba(ang, dq, tau, ddq)
        # our continuous joint turns about the URDF axis (0 0 -1); pin's too: same sign
        np.testing.assert_allclose(ddq, ref, atol=1e-9, rtol=0)
        chain.frame("d", ang, pos, J)
        pin.forwardKinematics(model, data, qp)
        pin.updateFramePlacements(model, data)
        np.testing.assert_allclose(pos, data.oMf[fid].translation, atol=1e-12)


@pytest.mark.parametrize("text, lock, match", [
    ("<robot name='x'><link name='a'/></robot>", None, "no moving joint"),
    ("<robot name='x'><link name='a'/><link name='b'/><joint name='j' type='floating'>"
     "<parent link='a'/><child link='b'/></joint></robot>", None, r"joint\[j\]: type 'floating'"),
    ("<robot name='x'><link name='a'/><joint name='j' type='revolute'>"
     "<parent link='a'/><child link='zz'/></joint></robot>", None, "unknown link 'zz'"),
    ("<robot name='x'><link name='a'/><link name='b'/><joint name='j' type='revolute'>"
     "<parent link='a'/><child link='b'/><axis xyz='0 0'/></joint></robot>", None, r"joint\[j\].axis"),
    ("<robot name='x'><link name='a'/><link name='b'/><joint name='j' type='revolute'>"
     "<parent link='a'/><child link='b'/></joint></robot>", {"nope": 0.0}, "unknown joint"),
])
def test_bad_urdf_errors_name_the_element(text, lock, match):
    with pytest.raises(URDFError, match=match):
        parse_urdf(ET.fromstring(text), lock=lock)


def test_missing_file_is_a_urdf_error(tmp_path):
    with pytest.raises(URDFError, match="cannot read URDF"):
        read_urdf(tmp_path / "none.urdf")
