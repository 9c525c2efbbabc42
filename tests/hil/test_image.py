"""Process image: consistent (never torn) reads and writes across processes."""

import multiprocessing as mp
import time

import numpy as np
import pytest

from hil.image import ProcessImage

N_IN, N_OUT = 6, 40


def _hammer_writer(name: str, stop, n_done):
    """Another process writes all inputs at once, always the same value in every slot."""
    img = ProcessImage.attach(name)
    k = 0
    idx = np.arange(N_IN)
    while not stop.is_set():
        k += 1
        img.write_inputs(idx, np.full(N_IN, float(k)))
    n_done.value = k
    img.close()


def _hammer_reader(name: str, stop, result):
    """Another process reads outputs; every snapshot must be one whole publish."""
    img = ProcessImage.attach(name)
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
    stop = ctx.Event()
    n_writes = ctx.Value("q", 0)
    result = ctx.Array("q", 2)
    procs = [ctx.Process(target=_hammer_writer, args=(img.name, stop, n_writes)),
             ctx.Process(target=_hammer_reader, args=(img.name, stop, result))]
    try:
        for p in procs:
            p.start()
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
