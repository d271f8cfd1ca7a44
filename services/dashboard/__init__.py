"""`helios dashboard`: the terminal view of one engine (throughput, scheduler graphs, requests)."""
