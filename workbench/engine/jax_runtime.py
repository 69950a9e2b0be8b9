"""The JAX runtime beside torch's: ``jax.distributed`` on the workbench's ranks.

:func:`workbench.engine.runtime.bootstrap` calls :func:`initialize` on every rank at once
for a set started with ``--framework jax`` (rank 0 hosts JAX's coordination service, so
the call is a rendezvous, as ``init_process_group`` is). CPU collectives go over gloo, so
``jax.devices()`` lists every rank's devices and one ``Mesh`` spans the ranks. torch is
never imported here: a JAX rank does not pay for it.
"""

from __future__ import annotations

# JAX's own names for its CPU collectives; "gloo" is what jaxlib builds on Linux
CPU_COLLECTIVES = "gloo"


def initialize(*, rank: int, world_size: int, coordinator: str, timeout_s: float) -> str:
    """Join the JAX job at ``coordinator`` (``host:port``) as process ``rank`` of ``world_size``;
    returns this rank's device (``cpu``, or ``gpu:0`` where jaxlib has a GPU backend)."""
    import jax

    if jax.distributed.is_initialized():
        raise RuntimeError(f"rank {rank}: jax.distributed is already initialised")
    jax.config.update("jax_cpu_collectives_implementation", CPU_COLLECTIVES)
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=world_size,
        process_id=rank,
        initialization_timeout=max(1, int(timeout_s)),
    )
    dev = jax.local_devices()[0]
    return "cpu" if dev.platform == "cpu" else f"{dev.platform}:{dev.id}"


def summary() -> dict:
    """What this rank's JAX sees: process index and count, its devices and the global ones."""
    import jax

    return {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "local_devices": [str(d) for d in jax.local_devices()],
        "device_count": jax.device_count(),
        "jax": jax.__version__,
    }
