"""Deterministic simulation of the Redlock flow and the real Lua scripts (issue 26)."""
