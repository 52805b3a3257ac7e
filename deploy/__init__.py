"""Launching the cluster: `python -m deploy.launch`, worker backends (Ray actors or subprocesses)."""
