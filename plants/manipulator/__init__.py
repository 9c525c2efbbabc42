"""Manipulator plant: URDF reader, articulated-body dynamics, drives and grasp contact.

Pure Numba kernels over preallocated arrays; imports nothing from `hil` or `adapters`.
Modules: `urdf` (reader -> KinematicTree), `dynamics` (ABA, RNEA, kinematics, energy),
`chain` (a chain model with its work arrays), `drive` (friction, motors, limits, control
modes), `grasp` (gripper and object contact), `arm` (the full plant step and state layout).
"""
