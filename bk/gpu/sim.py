"""Simulated GPUs, for trying bk anywhere and for tests.

``CountBackend`` knows only how many GPUs there are (live data unknown).
``FileBackend`` reads a JSON document describing GPUs and their processes;
the file is re-read on every ``devices()`` call so a demo or test can change
the "live" state while bk runs.  The format is documented in
docs/SIMULATION.md.
"""

from __future__ import annotations

import json

from bk.core.errors import ConfigError
from bk.core.models import GpuInfo, GpuProcess
from bk.gpu import Backend


def sim_uuid(index: int) -> str:
    return f"GPU-5133d000-0000-4000-8000-{index:012d}"


class CountBackend(Backend):
    simulated = True

    def __init__(self, n: int, reason: str | None = None):
        self.name = "sim-count"
        self._n = n
        self.reason = reason

    def count(self) -> int:
        return self._n

    def devices(self) -> list[GpuInfo]:
        return [GpuInfo(i, sim_uuid(i), "Simulated GPU") for i in range(self._n)]


def _opt_int(d: dict, key: str, where: str, lo: int = 0) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ConfigError(f"{where}: {key} must be a whole number >= {lo}, got {json.dumps(v)}")
    return v


def parse_sim(doc: object, source: str) -> list[GpuInfo]:
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list) or not doc["gpus"]:
        raise ConfigError(f"{source}: expected an object with a non-empty list \"gpus\"",
                          hint='example: {"gpus": [{"name": "H100", "mem_total_mib": 81559}]}')
    out = []
    for i, g in enumerate(doc["gpus"]):
        where = f"{source}: gpus[{i}]"
        if not isinstance(g, dict):
            raise ConfigError(f"{where}: expected an object")
        procs = g.get("processes")
        plist = None
        if procs is not None:
            if not isinstance(procs, list):
                raise ConfigError(f"{where}: processes must be a list")
            plist = []
            for j, p in enumerate(procs):
                pw = f"{where}.processes[{j}]"
                if not isinstance(p, dict) or not isinstance(p.get("pid"), int):
                    raise ConfigError(f"{pw}: expected an object with an integer pid")
                plist.append(GpuProcess(pid=p["pid"], mem_mib=_opt_int(p, "mem_mib", pw),
                                        sm=_opt_int(p, "sm", pw), uid=_opt_int(p, "uid", pw),
                                        user=p.get("user"), label=p.get("label")))
        out.append(GpuInfo(
            index=i, uuid=str(g.get("uuid") or sim_uuid(i)), name=str(g.get("name") or "Simulated GPU"),
            mem_total_mib=_opt_int(g, "mem_total_mib", where, 1),
            mem_used_mib=_opt_int(g, "mem_used_mib", where),
            util=_opt_int(g, "util", where), temperature=_opt_int(g, "temperature", where),
            processes=plist))
    return out


class FileBackend(Backend):
    simulated = True
    reason = None

    def __init__(self, path: str):
        self.name = "sim-file"
        self.path = path
        self._count: int | None = None

    def devices(self) -> list[GpuInfo]:
        try:
            with open(self.path, "rb") as f:
                doc = json.loads(f.read())
        except OSError as e:
            raise ConfigError(f"BK_GPU_SIM_FILE {self.path}: {e.strerror}") from None
        except ValueError as e:
            raise ConfigError(f"BK_GPU_SIM_FILE {self.path} is not valid JSON: {e}") from None
        gpus = parse_sim(doc, self.path)
        self._count = len(gpus)
        return gpus

    def count(self) -> int:
        if self._count is None:
            self.devices()
        return self._count
