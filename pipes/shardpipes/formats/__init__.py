"""Formats: tar headers and parsing, and the rule that groups members into samples (no I/O of their own)."""
