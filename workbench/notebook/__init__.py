"""The notebook kernel's side: rank sets, %distrain magics, the event stream, dashboards,
checkpoint commands. Nothing here imports torch, so the kernel never initialises CUDA and
can always start new ranks (tests/test_boundaries.py)."""
