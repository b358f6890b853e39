"""A fake ``libnvidia-ml.so.1``, built here with the C compiler, for running
the real ``nvidia-ml-py`` bindings (and so bk's NVML backend) without a GPU.

Two modes, chosen per call by the environment of the process that loads it:

* the fixed world (default): two GPUs with fixed readings, which
  ``FAKE_NVML_MODE`` (comma-separated words) can degrade: ``lost`` (GPU 1
  fails with GPU_IS_LOST), ``noinit``, ``nouuid``, ``notemp``, ``nographics``,
  ``nosm``, ``nopower``, ``noenergy``; ``FAKE_NVML_ENERGY`` sets GPU 0's
  energy counter (mJ);
* a world read from a file on every call, ``FAKE_NVML_STATE=path``, which a
  test rewrites between looks (how the activity traces are replayed)::

      gpu INDEX util U mem_total MIB mem_used MIB temp C power MW limit MW energy MJ ts US
      proc GPU PID MEM_MIB SM

  ``-1`` for a value: the device does not support it (NOT_SUPPORTED); ``SM``
  -1: no utilisation sample for that process since the last look (as the
  driver does for a process that ran no kernel); ``ts`` is the timestamp
  (microseconds) of this look's samples and must grow between looks.

``fake_init_calls()`` counts ``nvmlInitWithFlags``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CC = shutil.which("cc") or shutil.which("gcc")

SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned gpu, memory; } util_t;
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } proc_t;
typedef struct { unsigned pid; unsigned long long ts; unsigned sm, mem, enc, dec; } sample_t;
#define MIB (1024ULL * 1024ULL)
#define MAXG 16
#define MAXP 256
static int devs[MAXG];
static int inits = 0;
int fake_init_calls(void) { return inits; }
static const char *mode(void) { const char *m = getenv("FAKE_NVML_MODE"); return m ? m : ""; }
static int has(const char *w) { return strstr(mode(), w) != NULL; }
static int idx(void *h) { return (int *)h - devs; }

/* ---- the world from FAKE_NVML_STATE ---- */
typedef struct { long long util, total, used, temp, power, limit, energy, ts; } gstate_t;
typedef struct { int gpu; unsigned pid; long long mem, sm; } pstate_t;
static gstate_t G[MAXG];
static pstate_t P[MAXP];
static int ng = 0, np = 0;
static int state(void) {
  const char *path = getenv("FAKE_NVML_STATE");
  if (!path || !*path) return 0;
  FILE *f = fopen(path, "r");
  ng = 0; np = 0;
  if (!f) return 1;
  char word[16];
  while (fscanf(f, "%15s", word) == 1) {
    if (!strcmp(word, "gpu")) {
      int i; gstate_t g;
      if (fscanf(f, " %d util %lld mem_total %lld mem_used %lld temp %lld power %lld limit %lld energy %lld ts %lld",
                 &i, &g.util, &g.total, &g.used, &g.temp, &g.power, &g.limit, &g.energy, &g.ts) != 9) break;
      if (i >= 0 && i < MAXG) { G[i] = g; if (i + 1 > ng) ng = i + 1; }
    } else if (!strcmp(word, "proc")) {
      pstate_t p;
      if (fscanf(f, " %d %u %lld %lld", &p.gpu, &p.pid, &p.mem, &p.sm) != 4) break;
      if (np < MAXP) P[np++] = p;
    } else break;
  }
  fclose(f);
  return 1;
}
#define ST_VALUE(field, out) do { long long v = G[idx(h)].field; if (v < 0) return 3; *(out) = v; return 0; } while (0)

int nvmlInitWithFlags(unsigned f) { inits++; return has("noinit") ? 9 : 0; }
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return "fake error"; }
int nvmlSystemGetDriverVersion(char *b, unsigned n) { strncpy(b, "999.1", n); return 0; }
int nvmlDeviceGetCount_v2(unsigned *c) { *c = state() ? ng : 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) {
  unsigned n = state() ? ng : 2;
  if (i >= n) return 2;
  *h = &devs[i]; return 0;
}
/* GPU 1 is lost in mode "lost" */
static int bad(void *h) { return has("lost") && idx(h) == 1; }
int nvmlDeviceGetUUID(void *h, char *b, unsigned n) {
  if (state()) { snprintf(b, n, "GPU-fa4e0000-0000-4000-8000-%012d", idx(h)); return 0; }
  if (bad(h)) return 15;
  if (has("nouuid") && idx(h) == 1) return 3;
  strncpy(b, idx(h) ? "GPU-bbbbbbbb-0000-0000-0000-000000000001" : "GPU-aaaaaaaa-0000-0000-0000-000000000000", n);
  return 0;
}
int nvmlDeviceGetName(void *h, char *b, unsigned n) {
  if (state()) { strncpy(b, "NVIDIA H100 80GB HBM3", n); return 0; }
  if (bad(h)) return 15;
  strncpy(b, idx(h) ? "NVIDIA A100-SXM4-40GB" : "NVIDIA H100 80GB HBM3", n); return 0;
}
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
  if (state()) {
    gstate_t *g = &G[idx(h)];
    if (g->total < 0 || g->used < 0) return 3;
    m->total = g->total * MIB; m->used = g->used * MIB; m->free = m->total - m->used; return 0;
  }
  if (bad(h)) return 15;
  m->total = (idx(h) ? 40960ULL : 81559ULL) * MIB; m->used = (idx(h) ? 0ULL : 10240ULL) * MIB;
  m->free = m->total - m->used; return 0;
}
int nvmlDeviceGetUtilizationRates(void *h, util_t *u) {
  if (state()) { if (G[idx(h)].util < 0) return 3; u->gpu = G[idx(h)].util; u->memory = 0; return 0; }
  if (bad(h)) return 15;
  u->gpu = idx(h) ? 0 : 37; u->memory = 5; return 0;
}
int nvmlDeviceGetTemperature(void *h, int s, unsigned *t) {
  if (state()) { unsigned v; long long x = G[idx(h)].temp; if (x < 0) return 3; v = x; *t = v; return 0; }
  if (bad(h)) return 15;
  if (has("notemp")) return 3;
  *t = idx(h) ? 30 : 45; return 0;
}
int nvmlDeviceGetPowerUsage(void *h, unsigned *mw) {
  if (state()) { long long x = G[idx(h)].power; if (x < 0) return 3; *mw = (unsigned)x; return 0; }
  if (bad(h)) return 15;
  if (has("nopower") || idx(h) == 1) return 3;
  *mw = 71500; return 0;
}
int nvmlDeviceGetEnforcedPowerLimit(void *h, unsigned *mw) {
  if (state()) { long long x = G[idx(h)].limit; if (x < 0) return 3; *mw = (unsigned)x; return 0; }
  if (bad(h)) return 15;
  if (has("nopower")) return 3;
  *mw = idx(h) ? 400000 : 700000; return 0;
}
int nvmlDeviceGetTotalEnergyConsumption(void *h, unsigned long long *mj) {
  if (state()) { long long x = G[idx(h)].energy; if (x < 0) return 3; *mj = (unsigned long long)x; return 0; }
  if (bad(h)) return 15;
  if (has("noenergy") || idx(h) == 1) return 3;
  const char *e = getenv("FAKE_NVML_ENERGY");
  *mj = e ? strtoull(e, NULL, 10) : 123456789ULL; return 0;
}
static int procs(void *h, unsigned *c, proc_t *p, const proc_t *src, unsigned n) {
  if (bad(h)) return 15;
  if (idx(h) == 1) n = 0;
  if (n == 0) { *c = 0; return 0; }
  if (p == NULL || *c < n) { *c = n; return 7; }
  memcpy(p, src, n * sizeof(proc_t)); *c = n; return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *c, proc_t *p) {
  if (state()) {
    proc_t src[MAXP]; unsigned n = 0; int i;
    for (i = 0; i < np; i++) if (P[i].gpu == idx(h)) {
      src[n].pid = P[i].pid; src[n].used = P[i].mem < 0 ? 0 : (unsigned long long)P[i].mem * MIB;
      src[n].gi = src[n].ci = 0; n++;
    }
    if (n == 0) { *c = 0; return 0; }
    if (p == NULL || *c < n) { *c = n; return 7; }
    memcpy(p, src, n * sizeof(proc_t)); *c = n; return 0;
  }
  static const proc_t src[] = {{1001, 4096 * MIB, 0, 0}, {1002, 2048 * MIB, 0, 0}};
  return procs(h, c, p, src, 2);
}
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *h, unsigned *c, proc_t *p) {
  if (state()) { *c = 0; return 0; }
  if (has("nographics")) return 3;
  static const proc_t src[] = {{1001, 4096 * MIB, 0, 0}, {1003, 512 * MIB, 0, 0}};
  return procs(h, c, p, src, 2);
}
int nvmlDeviceGetProcessUtilization(void *h, sample_t *s, unsigned *c, unsigned long long since) {
  if (state()) {
    sample_t src[MAXP]; unsigned n = 0; int i;
    unsigned long long ts = G[idx(h)].ts;
    if (has("nosm")) return 3;
    for (i = 0; i < np; i++) if (P[i].gpu == idx(h) && P[i].sm >= 0 && ts > since) {
      src[n].pid = P[i].pid; src[n].ts = ts; src[n].sm = (unsigned)P[i].sm;
      src[n].mem = src[n].enc = src[n].dec = 0; n++;
    }
    if (n == 0) return 6;
    if (s == NULL || *c < n) { *c = n; return 7; }
    memcpy(s, src, n * sizeof(sample_t)); *c = n; return 0;
  }
  static const sample_t src[] = {{1001, 100, 10, 0, 0, 0}, {1001, 200, 30, 0, 0, 0}, {1002, 150, 5, 0, 0, 0}};
  if (bad(h)) return 15;
  if (has("nosm")) return 3;
  if (idx(h) == 1) return 6;
  unsigned n = 0, i;
  for (i = 0; i < 3; i++) if (src[i].ts > since) n++;
  if (n == 0) return 6;
  if (s == NULL || *c < n) { *c = n; return 7; }
  for (i = 0, n = 0; i < 3; i++) if (src[i].ts > since) s[n++] = src[i];
  *c = n; return 0;
}
int nvmlDeviceGetMigMode(void *h, unsigned *cur, unsigned *pend) {
  if (state()) return 3;
  if (bad(h)) return 15;
  if (idx(h) == 0) return 3;
  *cur = 1; *pend = 1; return 0;
}
"""


def build(directory: Path) -> Path:
    """Compile the fake into ``directory/libnvidia-ml.so.1``; returns the
    directory (for ``LD_LIBRARY_PATH``)."""
    if CC is None:
        raise RuntimeError("no C compiler")
    (directory / "fake.c").write_text(SOURCE)
    subprocess.run([CC, "-shared", "-fPIC", "-O1", "-Wl,-soname,libnvidia-ml.so.1", "-o",
                    str(directory / "libnvidia-ml.so.1"), str(directory / "fake.c")], check=True,
                   capture_output=True)
    return directory


def state_text(gpus: list[dict], procs: list[tuple[int, int, int, int]]) -> str:
    """A FAKE_NVML_STATE document: ``gpus`` with the keys of the ``gpu``
    line (missing: -1), ``procs`` as (gpu, pid, mem_mib, sm)."""
    keys = ("util", "mem_total", "mem_used", "temp", "power", "limit", "energy", "ts")
    lines = []
    for i, g in enumerate(gpus):
        lines.append(f"gpu {i} " + " ".join(f"{k} {int(g.get(k, -1) if g.get(k) is not None else -1)}"
                                            for k in keys))
    for gpu, pid, mem, sm in procs:
        lines.append(f"proc {gpu} {pid} {mem} {sm}")
    return "\n".join(lines) + "\n"
