"""The service layer: one application API for every front end.

``open_app(env)`` reads the configuration and returns the service for this
process: in private mode one whose operations run on the local ledger, in
shared mode one whose reads come from the committed ledger file and whose
operations go to the broker.  Tests inject the actor, the clock and the GPU
backend instead of patching.
"""

from __future__ import annotations


def open_app(env: dict, *, actor=None, clock_fn=None, backend=None, connect=None):
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

        return open_(env, settings["gpu_count"])

    telemetry = Telemetry(open_backend, clock=clock_fn, cache_dir=where.cache_dir)
    if settings.mode == "shared":
        return Service.remote(settings, telemetry, actor=actor, clock_fn=clock_fn, connect=connect)
    return Service.local(settings, telemetry, actor=actor, clock_fn=clock_fn)
