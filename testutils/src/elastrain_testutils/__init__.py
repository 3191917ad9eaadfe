"""Helpers shared by the elastrain test suites."""
