"""The service layer: one application API for every front end.

``open_app(env)`` reads the configuration, picks the GPU backend and returns
the service for this process: a local ``Service`` in private mode, or in
shared mode a client whose reads come from the committed ledger file and
whose writes go to the broker.
"""

from __future__ import annotations


def open_app(env: dict):
    from bk.gpu import open_backend
    from bk.service.app import Service
    from bk.store.config import load
    from bk.store.paths import locate

    settings = load(locate(env))
    backend = open_backend(env, settings["gpu_count"])
    if settings.mode == "shared":
        from bk.service.remote import RemoteService

        return RemoteService(settings, backend)
    return Service(settings, backend)
