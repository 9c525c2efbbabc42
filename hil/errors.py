"""The exception types users see."""

from __future__ import annotations


class ConfigError(ValueError):
    """A scenario is invalid. `problems` is a list of (key_path, reason) pairs.

    The message names every key path and why, one per line:
    `modbus.registers[3].address: 70000 is outside 0..65535`.
    """

    def __init__(self, path: str, reason: str | None = None, *, problems=None, source=None):
        self.problems: list[tuple[str, str]] = list(problems or [(path, reason or "invalid")])
        self.source = source
        lines = [f"{p}: {r}" if p else r for p, r in self.problems]
        prefix = f"{source}: " if source else ""
        if len(lines) == 1:
            msg = prefix + lines[0]
        else:
            msg = prefix + f"{len(lines)} problems\n  " + "\n  ".join(lines)
        super().__init__(msg)

    @property
    def path(self) -> str:
        return self.problems[0][0]

    @property
    def reason(self) -> str:
        return self.problems[0][1]


class PlantDiverged(RuntimeError):
    """The plant state became non-finite; names the state, the step and the sim time."""

    def __init__(self, state: str, step: int, sim_time_s: float):
        self.state, self.step, self.sim_time_s = state, step, sim_time_s
        super().__init__(
            f"plant state {state!r} became non-finite at step {step} (t = {sim_time_s:g} s); "
            "run stopped, recording kept up to this step"
        )


class RunStopped(Exception):
    """The loop stops a run on a condition the scenario makes fatal (stop reason, exit code)."""

    def __init__(self, reason: str, message: str, exit_code: int):
        self.reason, self.message, self.exit_code = reason, message, exit_code
        super().__init__(message)
