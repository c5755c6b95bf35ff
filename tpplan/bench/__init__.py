"""Measurements on real hardware (torch imported lazily inside the functions that need it)."""
