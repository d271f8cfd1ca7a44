"""The engine core: scheduler + runner in their own process, and the servicer's IPC client."""
