"""Generators of the documentation site's reference pages (run by `docs/hooks.py` at build time).

Each function returns Markdown text built from the code itself (config models, click commands,
benchmark result files), so the reference cannot drift from what hil does.
"""
