"""Simulated GPUs, for trying bk anywhere and for tests.

``CountBackend`` knows only how many GPUs there are (live data unknown).
``FileBackend`` reads a JSON document describing GPUs and their processes;
the file is re-read on every ``snapshot()`` so a demo or test can change the
"live" state while bk runs; its fingerprint is the file's identity and
modification time, so an edited file is a new inventory.  The format is documented in
docs/SIMULATION.md.

Processes in the file are fictional unless the file says otherwise:
``"proc": true`` (for the whole file, or on one process) means its PIDs are
real processes of this machine, whose owner, label, start and container
are read from /proc for the fields the file leaves out (how the tests run
real processes as real users through the whole stack without a GPU).
"""

from __future__ import annotations

import os

from bk.core import jsonfast
from bk.core.errors import ConfigError
from bk.core.models import GpuInfo, GpuProcess, parse_iso
from bk.core.telemetry import Inventory, Snapshot
from bk.gpu import Backend

# What a count-only simulation cannot see.
COUNT_GAPS = ("utilisation", "memory", "processes", "temperature")
# What a simulation file can say.
FILE_CAPABILITIES = ("uuid", "memory", "utilisation", "temperature", "processes", "process_sm",
                     "process_owner")


def sim_uuid(index: int) -> str:
    return f"GPU-5133d000-0000-4000-8000-{index:012d}"


class CountBackend(Backend):
    simulated = True

    def __init__(self, n: int, reason: str | None = None, *, name: str = "sim-count"):
        self.name = name
        self._n = n
        self.reason = reason

    def fingerprint(self) -> str:
        return f"{self.name}:{self._n}"

    def _gpus(self) -> tuple[GpuInfo, ...]:
        return tuple(GpuInfo(i, sim_uuid(i), "Simulated GPU") for i in range(self._n))

    def static_inventory(self) -> Inventory:
        return self.inventory()

    def inventory(self) -> Inventory:
        return Inventory(self.name, self._gpus(), True, self.reason)

    def snapshot(self, now: int) -> Snapshot:
        return Snapshot(now, self.name, self._gpus(), COUNT_GAPS, True, self.reason)


def _opt_int(d: dict, key: str, where: str, lo: int = 0) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ConfigError(f"{where}: {key} must be a whole number >= {lo}, got {jsonfast.dumps(v)}")
    return v


def _opt_str(d: dict, key: str, where: str) -> str | None:
    v = d.get(key)
    if v is not None and not isinstance(v, str):
        raise ConfigError(f"{where}: {key} must be a string, got {jsonfast.dumps(v)}")
    return v


def _since(d: dict, where: str) -> int | None:
    v = d.get("since")
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
        return v
    if isinstance(v, str):
        try:
            return parse_iso(v)
        except ValueError:
            pass
    raise ConfigError(f"{where}: since must be an ISO-8601 time or epoch seconds, got {jsonfast.dumps(v)}")


def _real(flag: object, where: str) -> bool:
    if not isinstance(flag, bool):
        raise ConfigError(f"{where}: proc must be true or false, got {jsonfast.dumps(flag)}")
    return flag


def parse_sim(doc: object, source: str, procinfo=None) -> list[GpuInfo]:
    """The GPUs a simulation document describes; ``procinfo`` (a
    ``bk.gpu.procinfo.ProcInfo``) fills the processes marked real."""
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list) or not doc["gpus"]:
        raise ConfigError(f"{source}: expected an object with a non-empty list \"gpus\"",
                          hint='example: {"gpus": [{"name": "H100", "mem_total_mib": 81559}]}')
    real_all = _real(doc.get("proc", False), source)
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
                gp = GpuProcess(pid=p["pid"], mem_mib=_opt_int(p, "mem_mib", pw),
                                sm=_opt_int(p, "sm", pw), uid=_opt_int(p, "uid", pw),
                                user=_opt_str(p, "user", pw), label=_opt_str(p, "label", pw),
                                since=_since(p, pw), container=_opt_str(p, "container", pw))
                if procinfo is not None and _real(p.get("proc", real_all), pw):
                    gp = procinfo.fill(gp)
                plist.append(gp)
        out.append(GpuInfo(
            index=i, uuid=str(g.get("uuid") or sim_uuid(i)), name=str(g.get("name") or "Simulated GPU"),
            mem_total_mib=_opt_int(g, "mem_total_mib", where, 1),
            mem_used_mib=_opt_int(g, "mem_used_mib", where),
            util=_opt_int(g, "util", where), temperature=_opt_int(g, "temperature", where),
            processes=plist, power_mw=_opt_int(g, "power_mw", where),
            power_limit_mw=_opt_int(g, "power_limit_mw", where), energy_mj=_opt_int(g, "energy_mj", where)))
    return out


def _static(g: GpuInfo) -> GpuInfo:
    return GpuInfo(g.index, g.uuid, g.name, mem_total_mib=g.mem_total_mib)


class FileBackend(Backend):
    simulated = True
    reason = None

    def __init__(self, path: str, *, proc_root: str = "/proc"):
        self.name = "sim-file"
        self.path = path
        self._proc_root = proc_root
        self._procinfo = None

    def fingerprint(self) -> str | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None          # the next question reports the error
        return f"sim-file:{self.path}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"

    def _read(self, live: bool = False) -> list[GpuInfo]:
        try:
            with open(self.path, "rb") as f:
                doc = jsonfast.loads(f.read())
        except OSError as e:
            raise ConfigError(f"BK_GPU_SIM_FILE {self.path}: {e.strerror}") from None
        except ValueError as e:
            raise ConfigError(f"BK_GPU_SIM_FILE {self.path} is not valid JSON: {e}") from None
        procinfo = None
        if live:
            if self._procinfo is None:
                from bk.gpu.procinfo import ProcInfo

                self._procinfo = ProcInfo(self._proc_root)
            procinfo = self._procinfo
        return parse_sim(doc, self.path, procinfo)

    def inventory(self) -> Inventory:
        return Inventory(self.name, tuple(_static(g) for g in self._read()), True)

    def snapshot(self, now: int) -> Snapshot:
        gpus = tuple(self._read(live=True))
        gaps = set()
        for g in gpus:
            for key, value in (("processes", g.processes), ("utilisation", g.util),
                               ("memory", g.mem_used_mib), ("temperature", g.temperature)):
                if value is None:
                    gaps.add(key)
        return Snapshot(now, self.name, gpus, tuple(sorted(gaps)), True, None, FILE_CAPABILITIES)
