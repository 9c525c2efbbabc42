"""The scenario file and what it names: the config models and their checks (config,
numbers, sections), the signal tables, paths, durations and the TCP ports it will bind."""
