"""Helpers shared by the test suites: real service processes, ports, health waits."""
