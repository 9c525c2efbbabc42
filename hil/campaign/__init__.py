"""Fault-injection campaigns: scenarios x faults x seeds -> runs -> verdicts with confidence bounds.

    schema.py     the campaign file ([campaign], [[scenarios]], [faults.*], [[criteria]], [report])
    faults.py     the fault library; stage.py: the FaultStage the loop calls (Runtime.hooks)
    plc.py        the SoftPLC's program stepped in simulated time (lockstep baseline)
    process_faults.py  policy / safety process faults (read by those processes from their env)
    expand.py     campaign -> run specs (ids, seeds)
    worker.py     one run: scenario + faults -> recording -> criteria -> result JSON
    criteria.py   per-run checks; stats.py: Clopper-Pearson bounds
    executors.py  local process pool (warm workers)
    ray_executor.py  runs as Ray tasks; lost nodes' runs rescheduled
    realtime.py   real-time runs: SoftPLC process, proxy.py (link faults), signals
    runner.py     the driver (resume, progress); bench.py: hil bench modbus|opcua
    report.py     JUnit XML and the self-contained HTML report
"""
