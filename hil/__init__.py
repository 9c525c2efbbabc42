"""hil: a hardware-in-the-loop runtime for sim-to-real control."""

__version__ = "0.1.0"
