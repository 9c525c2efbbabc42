"""Process image: consistent (never torn) reads and writes across processes."""

import multiprocessing as mp
import time

import numpy as np
import pytest

from hil.image import ProcessImage

N_IN, N_OUT = 6, 40


def _hammer_writer(name: str, stop, n_done, started):
    """Another process writes all inputs at once, always the same value in every slot."""
    img = ProcessImage.attach(name)
    started.release()
    k = 0
    idx = np.arange(N_IN)
    while not stop.is_set():
        k += 1
        img.write_inputs(idx, np.full(N_IN, float(k)))
    n_done.value = k
    img.close()


def _hammer_reader(name: str, stop, result, started):
    """Another process reads outputs; every snapshot must be one whole publish."""
    img = ProcessImage.attach(name)
    started.release()
    reads = torn = 0
    while not stop.is_set():
        snap = img.snapshot()
        reads += 1
        # the publisher writes step k into every output and applied slot
        if not (np.all(snap.outputs == snap.step) and np.all(snap.applied == snap.step)
                and snap.sim_time_s == snap.step * 0.5):
            torn += 1
    result[0], result[1] = reads, torn
    img.close()


def test_no_torn_reads_while_other_processes_hammer():
    ctx = mp.get_context("spawn")
    img = ProcessImage.create(N_IN, N_OUT)
    img.publish(np.zeros(N_OUT), np.zeros(N_IN), 0, 0.0)  # step 0: the reader's rule holds from the start
    stop = ctx.Event()
    n_writes = ctx.Value("q", 0)
    result = ctx.Array("q", 2)
    started = ctx.Semaphore(0)
    procs = [ctx.Process(target=_hammer_writer, args=(img.name, stop, n_writes, started)),
             ctx.Process(target=_hammer_reader, args=(img.name, stop, result, started))]
    try:
        for p in procs:
            p.start()
        for _ in procs:  # spawned children start slowly on a loaded machine: hammer once both run
            assert started.acquire(timeout=60), "a hammering process did not start"
        # the "loop": publish whole steps and read inputs, checking every input read
        u = np.zeros(N_IN)
        loop_reads = loop_torn = 0
        t_end = time.monotonic() + 3.0
        k = 0
        while time.monotonic() < t_end:
            k += 1
            img.publish(np.full(N_OUT, float(k)), np.full(N_IN, float(k)), k, k * 0.5)
            if img.read_inputs_into(u):
                loop_reads += 1
                if not np.all(u == u[0]):
                    loop_torn += 1
        stop.set()
        for p in procs:
            p.join(10)
            assert p.exitcode == 0
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.kill()
        img.close()
    reads, torn = result[0], result[1]
    assert n_writes.value > 100 and reads > 100 and loop_reads > 100
    assert torn == 0, f"{torn} torn output snapshots out of {reads}"
    assert loop_torn == 0, f"{loop_torn} torn input reads out of {loop_reads}"


def test_attach_by_name_and_layout_checks():
    with ProcessImage.create(3, 4) as img:
        other = ProcessImage.attach(img.name)
        img.publish(np.arange(4.0), np.arange(3.0), 7, 3.5)
        snap = other.snapshot()
        assert snap.step == 7 and snap.sim_time_s == 3.5
        np.testing.assert_array_equal(snap.outputs, np.arange(4.0))
        other.write_inputs([2, 0], [5.0, 1.0])
        np.testing.assert_array_equal(img.read_inputs(), [1.0, 0.0, 5.0])
        assert img.counters()["input_writes"] == 1
        other.close()


def test_reader_gives_up_on_a_writer_that_died_mid_write():
    """A writer killed mid-write (odd sequence) must not stall the loop's input read."""
    with ProcessImage.create(2, 2) as img:
        img.header[5] += 1  # H_IN_SEQ odd: a write that never finished
        dst = np.array([9.0, 9.0])
        assert img.read_inputs_into(dst, max_tries=16) is False
        np.testing.assert_array_equal(dst, [9.0, 9.0])  # previous inputs kept
        assert img.counters()["torn_input_reads"] == 1


def test_attach_to_foreign_block_is_refused():
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(create=True, size=4096)
    try:
        with pytest.raises(ValueError, match="not a hil process image"):
            ProcessImage.attach(shm.name)
    finally:
        shm.close()
        shm.unlink()


# ---- a writer that dies or fails mid-write ----
def _die_mid_write(name: str, index: int, value: float) -> None:
    """A writer SIGKILLed between the two sequence increments, part of its write landed."""
    import os
    import signal

    img = ProcessImage.attach(name)

    class DieWhileWriting:
        def __array__(self, dtype=None, copy=None):  # numpy converts the values mid-write
            img.inputs[index] = value  # a part of the write has reached the image
            os.kill(os.getpid(), signal.SIGKILL)

    img.write_inputs([index, (index + 1) % img.n_inputs], DieWhileWriting())


def _hold_mid_write(name: str, holding) -> None:
    """A live writer that hangs mid-write: the lock held, the sequence odd (until killed)."""
    img = ProcessImage.attach(name)

    class HangWhileWriting:
        def __array__(self, dtype=None, copy=None):  # numpy converts the values mid-write
            holding.set()
            time.sleep(120)

    img.write_inputs([0], HangWhileWriting())


def start_hung_writer(name: str):
    """A real process hanging mid-write; the caller kills it (p.kill(); p.join())."""
    ctx = mp.get_context("spawn")
    holding = ctx.Event()
    p = ctx.Process(target=_hold_mid_write, args=(name, holding), daemon=True)
    p.start()
    assert holding.wait(60), "the hung writer never took the lock"
    return p


def kill_mid_write(name: str, index: int, value: float) -> int:
    """Run `_die_mid_write` in a real process; returns its exit code."""
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_die_mid_write, args=(name, index, value))
    p.start()
    p.join(60)
    return p.exitcode


def test_writer_sigkilled_between_the_increments_is_rolled_back():
    from hil.image import H_IN_SEQ

    with ProcessImage.create(3, 2) as img:
        img.write_inputs([0, 1, 2], [1.0, 2.0, 3.0])
        assert kill_mid_write(img.name, 0, 999.0) == -9
        assert int(img.header[H_IN_SEQ]) & 1, "the writer did not die mid-write"
        # another process's reader: bounded, repairs, and sees the last complete write
        np.testing.assert_array_equal(img.read_inputs(timeout_s=5.0), [1.0, 2.0, 3.0])
        assert img.counters()["input_repairs"] == 1
        other = ProcessImage.attach(img.name)
        other.write_inputs([2], [4.0])  # writers keep working
        np.testing.assert_array_equal(img.read_inputs(), [1.0, 2.0, 4.0])
        other.close()


def test_next_writer_repairs_what_a_dead_writer_left():
    with ProcessImage.create(2, 2) as img:
        img.write_inputs([0, 1], [1.0, 2.0])
        assert kill_mid_write(img.name, 1, 999.0) == -9
        img.write_inputs([0], [5.0])  # takes the lock, finds the sequence odd: the writer is dead
        dst = np.zeros(2)
        assert img.read_inputs_into(dst, max_tries=4, mark_applied=False)
        np.testing.assert_array_equal(dst, [5.0, 2.0])  # nothing of the dead write kept
        assert img.counters()["input_repairs"] == 1


def test_loop_side_repair_never_blocks_and_needs_no_new_writer():
    with ProcessImage.create(2, 2) as img:
        img.write_inputs([0, 1], [1.0, 2.0])
        assert kill_mid_write(img.name, 0, 999.0) == -9
        dst = np.zeros(2)
        assert img.read_inputs_into(dst, max_tries=8) is False
        assert img.repair_inputs() is True
        assert img.repair_inputs() is False  # nothing left to repair
        assert img.read_inputs_into(dst)
        np.testing.assert_array_equal(dst, [1.0, 2.0])


@pytest.mark.parametrize("indices, values", [([0, 7], [1.0, 2.0]), ([0, 1], [1.0, "x"]), ([0, 1], [1.0, 2.0, 3.0])],
                         ids=["bad-index", "bad-value", "bad-shape"])
def test_writer_that_raises_mid_write_leaves_the_image_consistent(indices, values):
    from hil.image import H_IN_SEQ

    with ProcessImage.create(2, 2) as img:
        img.write_inputs([0, 1], [1.0, 2.0])
        with pytest.raises((IndexError, ValueError)):
            img.write_inputs(indices, values)
        assert int(img.header[H_IN_SEQ]) % 2 == 0
        dst = np.zeros(2)
        assert img.read_inputs_into(dst, max_tries=1)
        np.testing.assert_array_equal(dst, [1.0, 2.0])
        assert img.counters()["input_writes"] == 1


def test_hung_writer_gives_a_bounded_read_with_a_clear_error():
    from hil.image import InputsStale

    with ProcessImage.create(2, 2) as img:
        img.write_inputs([0, 1], [1.0, 2.0])
        p = start_hung_writer(img.name)
        try:
            with pytest.raises(InputsStale, match="mid-write"):
                img.read_inputs(timeout_s=0.2)
            assert img.repair_inputs() is None  # alive: not repaired behind its back
            with pytest.raises(InputsStale, match="lock"):  # a second writer is refused, not frozen
                img.write_inputs([0], [5.0])
            p.kill()  # now it dies holding the odd sequence
            p.join(10)
            np.testing.assert_array_equal(img.read_inputs(timeout_s=5.0), [1.0, 2.0])
        finally:
            p.kill()
            p.join(10)
