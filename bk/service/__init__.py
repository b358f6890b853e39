"""The service layer: one application API for every front end.

``open_app(env)`` reads the configuration and returns the service for this
process: in private mode one whose operations run on the local ledger, in
shared mode one whose reads come from the committed ledger file and whose
operations go to the broker.  Tests inject the actor, the clock and the GPU
backend instead of patching.
"""

from __future__ import annotations


def open_app(env: dict, *, actor=None, clock_fn=None, backend=None, telemetry=None, connect=None):
    """The service for this process.  Tests and embedding front ends may
    inject the actor, the clock, the GPU backend (or the whole telemetry,
    e.g. ``telemetry.Fixed`` with a snapshot) and the broker connection."""
    from bk import clock
    from bk.service.app import Service
    from bk.service.telemetry import Telemetry
    from bk.store.config import load
    from bk.store.paths import locate

    where = locate(env)
    settings = load(where)
    clock_fn = clock_fn or clock.now

    def open_backend():
        if backend is not None:
            return backend
        from bk.gpu import open_backend as open_

        return open_(env, settings["gpu_count"], simulated=settings["simulated_gpus"])

    if telemetry is None:
        telemetry = Telemetry(open_backend, clock=clock_fn, cache_dir=where.cache_dir, monitor=settings)
    if settings.mode == "shared":
        return Service.remote(settings, telemetry, actor=actor, clock_fn=clock_fn, connect=connect)
    return Service.local(settings, telemetry, actor=actor, clock_fn=clock_fn)


def open_host(env: dict, settings, *, service_uid: int, telemetry=None):
    """The broker's service: operations run on the shared ledger as the
    service account.  Its telemetry has no inventory cache: the broker lives
    for months and asks the backend itself, off the request path."""
    from bk import clock
    from bk.service.app import Service, user_name
    from bk.service.context import Actor
    from bk.service.telemetry import Telemetry

    if telemetry is None:
        def open_backend():
            from bk.gpu import open_backend as open_

            return open_(env, settings["gpu_count"], simulated=settings["simulated_gpus"])
        # The refresher reads the monitor's snapshot while it is fresh
        # (``Telemetry.snapshot``), so the broker asks the GPUs itself only
        # when no monitor runs.
        telemetry = Telemetry(open_backend, clock=clock.now, monitor=settings)
    actor = Actor(service_uid, user_name(service_uid))
    return Service.local(settings, telemetry, actor=actor, owner_uid=service_uid, clock_fn=clock.now)
