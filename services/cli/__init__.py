"""The `helios` command line: serve one service, run all four, prepare cores, build the demo."""
