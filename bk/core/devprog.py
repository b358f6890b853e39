"""Cgroup device programs: what they say, the bytes the kernel loads, and
a checker and interpreter of those bytes.

The facts this module is built on (Linux 4.15+, cgroup v2):

* A ``BPF_PROG_TYPE_CGROUP_DEVICE`` program attached to a cgroup runs at
  every ``open(2)`` and ``mknod(2)`` of a device node by a process of that
  cgroup or of any cgroup below it.  Its context is three 32-bit words:
  ``access_type`` (the device type in the low 16 bits, block 1 or char 2;
  the access bits, mknod 1, read 2, write 4, in the high 16), ``major`` and
  ``minor``.  It returns 1 (allow) or 0 (the open fails with ``EPERM``).
  With several programs on the path from the root (``BPF_F_ALLOW_MULTI``)
  every one must allow: a program a user could add below ours cannot undo
  a refusal of ours.
* The kernel checks at open time only: a descriptor opened before a
  refusal keeps working.
* The program may call ``bpf_ktime_get_boot_ns()`` (helper 125, the
  ``CLOCK_BOOTTIME`` clock, which counts suspend).  So a program can carry
  the times of its windows and switch by itself, to the nanosecond, with
  no process awake at the boundary.
* The verifier refuses unreachable instructions, backward jumps it cannot
  bound, reads of uninitialised registers, and context reads other than
  the three words.

The decision.  ``Grants`` is the whole meaning of one program: the devices
it governs (``managed``), the time windows in which each may be opened,
an ``expiry`` (the enforcer's lease) and what happens after it (``open``:
everything allowed; otherwise nothing managed is).  Every other device,
and every block device, is always allowed: ``nvidiactl``, ``nvidia-uvm``,
``nvidia-modeset``, ``/dev/null``.  ``generate`` writes the program,
``encode`` its bytes, ``decide`` is the meaning written as plain Python,
and ``run`` executes the bytes as the kernel would (after ``check``, the
subset of the verifier's rules that these programs can break), so tests
compare the two on any input without a kernel.
"""

from __future__ import annotations

import struct

from bk.core.record import dataclass

# Context and return values (include/uapi/linux/bpf.h).
DEV_BLOCK, DEV_CHAR = 1, 2
ACC_MKNOD, ACC_READ, ACC_WRITE = 1, 2, 4
ALLOW, DENY = 1, 0
HELPER_KTIME_GET_BOOT_NS = 125
CTX_WORDS = {0: "access_type", 4: "major", 8: "minor"}

# The instructions these programs use: (opcode, name).
MOV64_REG, MOV64_IMM = 0xBF, 0xB7
LDX_W = 0x61
AND32_IMM = 0x54
JA, JEQ_IMM, JNE_IMM, JLT_REG, JGE_REG = 0x05, 0x15, 0x55, 0xAD, 0x3D
LD_IMM64 = 0x18
CALL, EXIT = 0x85, 0x95
OPCODES = {MOV64_REG: "mov64", MOV64_IMM: "mov64i", LDX_W: "ldxw", AND32_IMM: "and32i", JA: "ja",
           JEQ_IMM: "jeqi", JNE_IMM: "jnei", JLT_REG: "jlt", JGE_REG: "jge", LD_IMM64: "lddw",
           CALL: "call", EXIT: "exit"}
JUMPS = {JA, JEQ_IMM, JNE_IMM, JLT_REG, JGE_REG}
MAX_INSNS = 1_000_000             # the kernel's limit (BPF_COMPLEXITY_LIMIT_INSNS); ours are a few dozen
U64 = (1 << 64) - 1


class ProgramError(ValueError):
    """A program the kernel's verifier would refuse (or that this module
    cannot run): says which instruction and why."""


@dataclass(frozen=True)
class Insn:
    """One 8-byte instruction slot.  ``LD_IMM64`` takes two slots: the
    second is an ``Insn(0)`` holding the upper 32 bits in ``imm``."""

    code: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0


@dataclass(frozen=True)
class Grants:
    """What one program allows.

    ``managed``: the (major, minor) pairs it governs.  ``windows``:
    ``(major, minor, from_ns, until_ns)``, half-open on the boot clock: the
    device may be opened while ``from_ns <= now < until_ns``.  ``expiry``:
    after it, everything is allowed when ``open`` is true (fail open) and
    nothing managed is otherwise (fail closed), so a program outlives a
    dead enforcer the way the administrator chose."""

    managed: tuple[tuple[int, int], ...]
    windows: tuple[tuple[int, int, int, int], ...]
    expiry: int
    open: bool = True


def decide(g: Grants, access_type: int, major: int, minor: int, now_ns: int) -> int:
    """The meaning of ``generate(g)``, in plain Python: ALLOW or DENY."""
    if access_type & 0xFFFF != DEV_CHAR or (major, minor) not in set(g.managed):
        return ALLOW
    if g.open and now_ns >= g.expiry:
        return ALLOW
    for ma, mi, lo, hi in g.windows:
        if (ma, mi) == (major, minor) and lo <= now_ns < hi:
            return ALLOW
    return DENY


# ----------------------------------------------------------------- assembly

class _Label:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class _Jump:
    __slots__ = ("code", "dst", "src", "imm", "target")

    def __init__(self, code: int, target: str, dst: int = 0, src: int = 0, imm: int = 0):
        self.code, self.target, self.dst, self.src, self.imm = code, target, dst, src, imm


def _imm64(dst: int, value: int) -> list[Insn]:
    value &= U64
    lo, hi = value & 0xFFFFFFFF, value >> 32
    return [Insn(LD_IMM64, dst, 0, 0, _s32(lo)), Insn(0, 0, 0, 0, _s32(hi))]


def _s32(v: int) -> int:
    return v - (1 << 32) if v & 0x80000000 else v


def _assemble(items: list) -> list[Insn]:
    """Resolve labels: a jump's offset counts slots from the next one.  An
    unconditional jump to a label that follows it with nothing but labels
    between does nothing and is dropped; walking backwards, a drop that
    makes an earlier jump just as useless drops that one too."""
    kept: list = []                       # the items after the current one, reversed
    for it in reversed(items):
        if isinstance(it, _Jump) and it.code == JA:
            k = len(kept) - 1
            while k >= 0 and isinstance(kept[k], _Label):
                if kept[k].name == it.target:
                    break
                k -= 1
            if k >= 0 and isinstance(kept[k], _Label):
                continue
        kept.append(it)
    kept.reverse()
    where, slot = {}, 0
    for it in kept:
        if isinstance(it, _Label):
            where[it.name] = slot
        else:
            slot += 1
    out: list[Insn] = []
    for it in kept:
        if isinstance(it, _Label):
            continue
        if isinstance(it, _Jump):
            out.append(Insn(it.code, it.dst, it.src, where[it.target] - (len(out) + 1), it.imm))
        else:
            out.append(it)
    return out


def generate(g: Grants) -> list[Insn]:
    """The program for ``g``.  Registers: r6 the context, r7 the boot clock
    read once at entry, r2-r4 the three context words, r8 a time bound."""
    items: list = [Insn(MOV64_REG, 6, 1), Insn(CALL, imm=HELPER_KTIME_GET_BOOT_NS), Insn(MOV64_REG, 7, 0),
                   Insn(LDX_W, 2, 6, 0), Insn(AND32_IMM, 2, imm=0xFFFF),
                   _Jump(JNE_IMM, "allow", dst=2, imm=DEV_CHAR),
                   Insn(LDX_W, 3, 6, 4), Insn(LDX_W, 4, 6, 8)]
    by_major: dict[int, dict[int, list[tuple[int, int]]]] = {}
    for ma, mi in sorted(set(g.managed)):
        by_major.setdefault(ma, {})[mi] = []
    for ma, mi, lo, hi in sorted(g.windows):
        if mi in by_major.get(ma, {}) and lo < hi:
            by_major[ma][mi].append((lo, hi))
    if g.open and by_major:
        items += _imm64(8, g.expiry) + [_Jump(JGE_REG, "allow", dst=7, src=8)]
    denies = False
    for ma, minors in by_major.items():
        items.append(_Jump(JNE_IMM, f"major{ma}", dst=3, imm=ma))
        for mi, windows in minors.items():
            items.append(_Jump(JNE_IMM, f"m{ma}.{mi}", dst=4, imm=mi))
            for k, (lo, hi) in enumerate(windows):
                skip = f"w{ma}.{mi}.{k}"
                if lo > 0:
                    items += _imm64(8, lo) + [_Jump(JLT_REG, skip, dst=7, src=8)]
                items += _imm64(8, hi) + [_Jump(JLT_REG, "allow", dst=7, src=8), _Label(skip)]
            items += [_Jump(JA, "deny"), _Label(f"m{ma}.{mi}")]
            denies = True
        items += [_Jump(JA, "allow"), _Label(f"major{ma}")]
    items += [_Label("allow"), Insn(MOV64_IMM, 0, imm=ALLOW), Insn(EXIT)]
    if denies:
        items += [_Label("deny"), Insn(MOV64_IMM, 0, imm=DENY), Insn(EXIT)]
    return _assemble(items)


def encode(prog: list[Insn]) -> bytes:
    """The bytes of ``struct bpf_insn[]`` (little-endian, x86_64 and arm64)."""
    return b"".join(struct.pack("<BBhi", i.code, (i.dst & 0xF) | ((i.src & 0xF) << 4), i.off, i.imm)
                    for i in prog)


def decode(raw: bytes) -> list[Insn]:
    if len(raw) % 8:
        raise ProgramError(f"{len(raw)} bytes is not a whole number of instructions")
    out = []
    for k in range(0, len(raw), 8):
        code, regs, off, imm = struct.unpack_from("<BBhi", raw, k)
        out.append(Insn(code, regs & 0xF, regs >> 4, off, imm))
    return out


def listing(prog: list[Insn]) -> str:
    """One line per slot, for people reading a refusal."""
    lines = []
    for n, i in enumerate(prog):
        lines.append(f"{n:4d}: {OPCODES.get(i.code, hex(i.code)):7s} r{i.dst} r{i.src} off={i.off} imm={i.imm}")
    return "\n".join(lines)


# ------------------------------------------------------------ check and run

def _width(prog: list[Insn], pc: int) -> int:
    return 2 if prog[pc].code == LD_IMM64 else 1


def check(prog: list[Insn]) -> None:
    """Raise ``ProgramError`` for what the verifier would refuse in the
    subset these programs use: unknown opcodes, bad registers, context
    reads other than the three words, helpers other than the boot clock,
    jumps backward, out of range or into the middle of a 64-bit load, an
    unpaired 64-bit load, a path that runs off the end, and unreachable
    slots.  Register initialisation is checked by ``run`` on each path."""
    n = len(prog)
    if not 0 < n <= MAX_INSNS:
        raise ProgramError(f"a program of {n} instructions")
    starts, pc = set(), 0
    while pc < n:
        i = prog[pc]
        if i.code not in OPCODES or (i.code == 0):
            raise ProgramError(f"insn {pc}: opcode {i.code:#x} is not one these programs use")
        if not (0 <= i.dst <= 10 and 0 <= i.src <= 10) or (i.dst == 10 and i.code not in JUMPS | {EXIT, CALL}):
            raise ProgramError(f"insn {pc}: register r{i.dst}/r{i.src}")
        if i.code == LD_IMM64:
            if pc + 1 >= n or prog[pc + 1].code != 0 or prog[pc + 1].dst or prog[pc + 1].src or prog[pc + 1].off:
                raise ProgramError(f"insn {pc}: a 64-bit load without its second half")
        if i.code == LDX_W and i.off not in CTX_WORDS:
            raise ProgramError(f"insn {pc}: context read at offset {i.off}")
        if i.code == CALL and i.imm != HELPER_KTIME_GET_BOOT_NS:
            raise ProgramError(f"insn {pc}: helper {i.imm}")
        starts.add(pc)
        pc += _width(prog, pc)
    seen, todo = set(), [0]
    while todo:
        pc = todo.pop()
        if pc in seen:
            continue
        if pc not in starts:
            raise ProgramError(f"a jump lands on slot {pc}, outside the program or inside a 64-bit load")
        seen.add(pc)
        i = prog[pc]
        nxt = pc + _width(prog, pc)
        if i.code == EXIT:
            continue
        if i.code in JUMPS:
            if i.off < 0:
                raise ProgramError(f"insn {pc}: backward jump")
            todo.append(nxt + i.off)
            if i.code != JA:
                todo.append(nxt)
            continue
        if nxt >= n:
            raise ProgramError(f"insn {pc}: the last instruction is not exit")
        todo.append(nxt)
    missing = sorted(starts - seen)
    if missing:
        raise ProgramError(f"unreachable instruction {missing[0]}")


def run(prog: list[Insn], access_type: int, major: int, minor: int, now_ns: int) -> int:
    """Execute ``prog`` on one context at boot time ``now_ns``: what the
    kernel would return.  Raises ``ProgramError`` on a read of a register
    no path has set (the verifier's other refusal), or a value other than
    0 or 1 returned."""
    check(prog)
    ctx = {0: access_type & 0xFFFFFFFF, 4: major & 0xFFFFFFFF, 8: minor & 0xFFFFFFFF}
    regs: dict[int, object] = {1: "ctx", 10: "fp"}

    def val(r: int, pc: int) -> int:
        v = regs.get(r)
        if not isinstance(v, int):
            raise ProgramError(f"insn {pc}: r{r} read before it was set" if v is None
                               else f"insn {pc}: r{r} holds a pointer, not a number")
        return v

    pc, steps = 0, 0
    while True:
        steps += 1
        if steps > MAX_INSNS:
            raise ProgramError("the program does not end")
        i = prog[pc]
        nxt = pc + _width(prog, pc)
        c = i.code
        if c == MOV64_REG:
            if regs.get(i.src) is None:
                raise ProgramError(f"insn {pc}: r{i.src} read before it was set")
            regs[i.dst] = regs[i.src]
        elif c == MOV64_IMM:
            regs[i.dst] = i.imm & U64            # the immediate is sign-extended to 64 bits
        elif c == LD_IMM64:
            regs[i.dst] = (i.imm & 0xFFFFFFFF) | ((prog[pc + 1].imm & 0xFFFFFFFF) << 32)
        elif c == LDX_W:
            if regs.get(i.src) != "ctx":
                raise ProgramError(f"insn {pc}: a load from r{i.src}, which is not the context")
            regs[i.dst] = ctx[i.off]
        elif c == AND32_IMM:
            regs[i.dst] = (val(i.dst, pc) & (i.imm & 0xFFFFFFFF)) & 0xFFFFFFFF
        elif c == CALL:
            for r in range(1, 6):
                regs.pop(r, None)                # the helper clobbers the argument registers
            regs[0] = now_ns & U64
        elif c == EXIT:
            r0 = val(0, pc)
            if r0 not in (ALLOW, DENY):
                raise ProgramError(f"insn {pc}: returns {r0}, not 0 or 1")
            return r0
        elif c in JUMPS:
            if c == JA:
                taken = True
            elif c == JEQ_IMM:
                taken = val(i.dst, pc) == i.imm & U64
            elif c == JNE_IMM:
                taken = val(i.dst, pc) != i.imm & U64
            elif c == JLT_REG:
                taken = val(i.dst, pc) < val(i.src, pc)
            else:
                taken = val(i.dst, pc) >= val(i.src, pc)
            if taken:
                nxt += i.off
        pc = nxt
