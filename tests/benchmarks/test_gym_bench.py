"""benchmarks/gym_speed.py: the goal is evaluated from CPU time per instance-step (no timing asserted)."""

import pytest

from .conftest import run_quick


@pytest.mark.timeout(600)
def test_quick_run_evaluates_the_cpu_goal():
    res = run_quick("gym_speed")
    cpu = res["cpu_us_per_instance_step"]
    assert set(cpu) == {"vector_1024", "vector_1024_serial", "vector_1024_numpy", "kernel_serial_1024", "python_loop"}
    assert res["answers_agree"] is True  # the fused step and the numpy path computed the same steps
    assert all(len(v["repeats"]) >= 3 and v["median"] > 0 for v in cpu.values())
    assert res["timing"]["warmup_call"] is True
    assert res["goal_us_per_instance_step"] == 2.0
    assert res["goals_met"] == {"cpu_us_per_instance_step": cpu["vector_1024"]["median"] <= 2.0}
    assert res["goal_met"] is res["goals_met"]["cpu_us_per_instance_step"]
    assert "goal_1e6_met" not in res  # no goal from a load-dependent wall rate
    assert res["quick"] is True  # so results.py refuses to publish it


@pytest.mark.timeout(600)
def test_stage_profile_reports_every_stage():
    """benchmarks/gym_stages.py: every stage timed over the same repeats, the derived figures
    are the differences they claim to be, the arenas and rings it reports are the env's."""
    res = run_quick("gym_stages", "--n", "64")
    cpu = res["cpu_us_per_instance_step"]
    assert set(cpu) == {"step", "fused_kernel", "fused_without_loop", "loop_batch_step", "plant",
                        "actuation_gaps", "sensing_gaps"}
    assert all(len(v["repeats"]) >= 3 and v["median"] > 0 for v in cpu.values())
    assert set(res["hot_us_per_instance_step"]) == {"plant", "actuation_gaps", "sensing_gaps", "fused_kernel"}
    d = res["derived_us"]
    assert d["python_per_call"] == pytest.approx(cpu["step"]["median"] - cpu["fused_kernel"]["median"])
    assert d["gaps"] == pytest.approx(cpu["actuation_gaps"]["median"] + cpu["sensing_gaps"]["median"])
    assert res["instances"] == 64 and res["quick"] is True
    # bioreactor_gym: observation delays up to 120 s (glucose, constant) -> 128 slots; the coolant's
    # normal actuation delay is bounded only by max_delay_s = 300 s -> 512 slots
    assert res["ring_slots"] == {"actuation": 512, "observation": 128}
    # the fused step's gaps in the shared-parameter layout (hil/gaps/compact.py): a record per
    # instance smaller than the loop's two arenas, its hot part a few hundred items, the drawn rows
    # those bioreactor_gym randomizes (feed_rate's gain, plc_inputs' median, ph and DO sensors)
    lay, arenas = res["layout"], res["arena_items_per_instance"]
    assert lay["record_items_per_instance"] < arenas["actuation"] + arenas["sensing"]
    assert 0 < lay["record_hot_items"] < lay["shared_items_per_block"]
    assert sorted(map(tuple, lay["drawn_rows"])) == [("actuators", 0), ("observation", 1), ("sensors", 1),
                                                     ("sensors", 2)]
