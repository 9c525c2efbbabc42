"""The policy process's entry point: confined first, numpy and the policy imported after.

    python -m hil.policy.process SCENARIO.toml --bootstrap-fd N [hil.policy.runner options]

What hil.safety.launch starts. Landlock confines the calling thread and the threads it starts
later, never threads that already exist, and importing numpy starts BLAS worker threads (one
per CPU): a runner module that imports numpy before it confines itself would keep one
unconfined thread in the policy's process. So this module, with only the standard library
loaded and the process's single thread, reads the bootstrap pipe (hil.safety.launch
read_bootstrap: scenario, channel keys, confinement plan), applies the confinement
(hil.confine.confine_self), and only then imports hil.policy.runner and runs it.
"""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    from hil.confine import confine_self
    from hil.safety.launch import read_bootstrap

    argv = list(sys.argv[1:] if argv is None else argv)
    fd = None
    if "--bootstrap-fd" in argv:
        i = argv.index("--bootstrap-fd")
        try:
            fd = int(argv[i + 1])
        except (IndexError, ValueError):
            print("policy: --bootstrap-fd needs a file descriptor number", file=sys.stderr)
            return 2
        del argv[i:i + 2]
    boot = read_bootstrap(fd)
    confinement = confine_self(boot.get("confine"))  # before numpy (threads) and the policy (untrusted)
    from hil.policy.runner import main as run

    return run(argv, boot=boot, confinement=confinement)


if __name__ == "__main__":
    sys.exit(main())
