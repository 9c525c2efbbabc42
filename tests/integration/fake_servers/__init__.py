"""Stand-in server modules for tests of adapters/process.py: each reports in its summary file
what it was handed, so the test sees the hand-over across the process boundary."""
