"""Checkpoint writing, reading and training state on the ranks (torch.distributed.checkpoint);
the notebook's commands are in :mod:`workbench.notebook.checkpoints`, the folder catalog and
manifest in :mod:`workbench.shared.checkpoint`."""
