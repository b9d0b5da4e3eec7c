"""Helpers for testing RL loops offline (emulators, fixture images)."""
