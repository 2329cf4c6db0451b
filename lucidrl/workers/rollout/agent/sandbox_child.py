"""The python tool's sandbox process: it confines itself, then runs the model's code.

Run as a script by lucidrl.workers.rollout.agent.sandbox (`python -I sandbox_child.py SETTINGS`), standard
library only. It never runs the code itself:

    this process (outside any namespace)     waits, reports the pid to kill on a timeout
      └ init (pid 1 of a new pid namespace)  waits for the code, reports its exit status
          └ the code                         confined: rlimits, landlock, seccomp, audit hook

The code's process confines itself before the code is read: resource limits; landlock (writes only
inside its working directory; no TCP; no signals or abstract unix sockets outside its domain);
seccomp (no new processes, no sockets but unix ones). Where a layer is not available, or not asked
for, an audit hook blocks the same operations at the Python level (which ctypes can get around: that
hook also refuses ctypes). A new user + network namespace leaves the process no network at all, and
the pid namespace ends every process the code might have started when init ends.

Reports go to the file descriptor `report_fd`, one JSON object per line; the code's process closes
its copy before the code runs, so the code cannot write them.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import signal
import struct
import sys
import traceback

CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
LANDLOCK_CREATE_RULESET_VERSION = 1
SYS_LANDLOCK = (444, 445, 446)  # create_ruleset, add_rule, restrict_self: the same on every architecture

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
if hasattr(_libc, "prctl"):  # Linux's
    _libc.prctl.restype = ctypes.c_int


def _syscall(number: int, *args: object) -> int:
    """syscall(2) with every argument a full-width long (variadic ints would leave the upper halves unset)."""
    return _libc.syscall(
        ctypes.c_long(number), *(a if isinstance(a, ctypes.Array) else ctypes.c_long(a or 0) for a in args)
    )


def _prctl(option: int, *args: object) -> int:
    return _libc.prctl(
        ctypes.c_int(option), *(a if isinstance(a, ctypes.Array) else ctypes.c_ulong(a) for a in args)
    )


def _report(fd: int, **fields: object) -> None:
    os.write(fd, (json.dumps(fields) + "\n").encode())


def _unshare(flags: int) -> bool:
    return _libc.unshare(flags) == 0


_LINUX = sys.platform.startswith("linux")


def _limit(settings: dict) -> dict[str, str]:
    """Set the resource limits; returns the ones the system refused (macOS refuses RLIMIT_AS), by name."""
    cpu, mem, out = settings["cpu_s"], settings["memory_mb"] << 20, settings["max_output_bytes"]
    refused = {}
    for name, which, value in (
        ("cpu", resource.RLIMIT_CPU, cpu),  # at the hard limit the kernel sends SIGKILL
        ("memory", resource.RLIMIT_AS, mem),
        ("output", resource.RLIMIT_FSIZE, out),  # stdout and stderr are files: SIGXFSZ past it
        ("files", resource.RLIMIT_NOFILE, 64),
        ("core", resource.RLIMIT_CORE, 0),
    ):
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError) as e:
            refused[f"rlimit {name}"] = str(e)
    return refused


# landlock access rights (linux/landlock.h)
_FS_WRITE = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))  # write file, remove, make *
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
_NET_TCP = (1 << 0) | (1 << 1)  # bind, connect (ABI 4)
_SCOPE = (1 << 0) | (1 << 1)  # abstract unix sockets, signals (ABI 6)


def _landlock(workdir: str) -> str:
    """Writes only beneath `workdir` (and to /dev/null); no TCP; signals and abstract unix sockets only
    within the sandbox. Returns what it applied, or raises OSError."""
    abi = _syscall(SYS_LANDLOCK[0], None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        raise OSError(ctypes.get_errno(), "landlock is not available in this kernel")
    fs = _FS_WRITE | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    net = _NET_TCP if abi >= 4 else 0
    scoped = _SCOPE if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _syscall(SYS_LANDLOCK[0], buf, len(attr), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path, access in ((workdir, fs), ("/dev/null", (1 << 1) | (_FS_TRUNCATE if abi >= 3 else 0))):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
                if _syscall(SYS_LANDLOCK[1], ruleset, 1, rule, 0) != 0:  # LANDLOCK_RULE_PATH_BENEATH
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
            finally:
                os.close(fd)
        if _syscall(SYS_LANDLOCK[2], ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return f"landlock ABI {abi}" + (" (+tcp)" if net else "") + (" (+signals)" if scoped else "")


# seccomp: (audit arch, {syscall: number}) per machine
_ARCHES = {
    "x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58, "clone3": 435, "socket": 41}),
    "aarch64": (0xC00000B7, {"clone": 220, "clone3": 435, "socket": 198}),
}
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS, _CLONE_THREAD, _AF_UNIX = 1, 38, 0x00010000, 1


def _seccomp() -> str:
    """No new processes (clone without CLONE_THREAD, fork, vfork; clone3 answers ENOSYS so that libc
    falls back to clone, whose flags a filter can read) and no sockets but unix ones: EPERM."""
    machine = platform.machine()
    if machine not in _ARCHES:
        raise OSError(0, f"no seccomp filter for {machine}")
    arch, nr = _ARCHES[machine]
    code: list[tuple[int, int, int, int] | tuple[str, ...]] = []
    ld, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06
    # labels are resolved below: ("jeq", k, label_true) jumps to the label when equal, else falls through
    code += [(ld, 0, 0, 4), ("jeq-else", arch, "deny"), (ld, 0, 0, 0)]
    if machine == "x86_64":
        code.append(("jge", 0x40000000, "deny"))  # the x32 ABI's numbers would pass the checks below
    for name in ("fork", "vfork"):
        if name in nr:
            code.append(("jeq", nr[name], "deny"))
    code += [("jeq", nr["clone3"], "enosys"), ("jeq", nr["clone"], "clone"), ("jeq", nr["socket"], "socket")]
    code += [(ret, 0, 0, _RET_ALLOW)]
    labels = {"clone": len(code)}
    code += [(ld, 0, 0, 16), ("jset", _CLONE_THREAD, "allow"), ("goto", "deny")]
    labels["socket"] = len(code)
    code += [(ld, 0, 0, 16), ("jeq", _AF_UNIX, "allow"), ("goto", "deny")]
    labels["allow"] = len(code)
    code.append((ret, 0, 0, _RET_ALLOW))
    labels["deny"] = len(code)
    code.append((ret, 0, 0, _RET_ERRNO | _EPERM))
    labels["enosys"] = len(code)
    code.append((ret, 0, 0, _RET_ERRNO | _ENOSYS))
    program = []
    for i, ins in enumerate(code):
        if isinstance(ins[0], int):
            program.append(ins)
            continue
        kind = ins[0]
        if kind == "goto":  # an always-true jump
            program.append((jge, labels[ins[1]] - i - 1, labels[ins[1]] - i - 1, 0))
            continue
        op = {"jeq": jeq, "jeq-else": jeq, "jset": jset, "jge": jge}[kind]
        offset = labels[ins[2]] - i - 1
        program.append((op, 0, offset, ins[1]) if kind == "jeq-else" else (op, offset, 0, ins[1]))
    filters = b"".join(struct.pack("HBBI", *ins) for ins in program)
    buf = ctypes.create_string_buffer(filters, len(filters))
    prog = struct.pack("@HP", len(program), ctypes.addressof(buf))
    prog_buf = ctypes.create_string_buffer(prog, len(prog))
    if _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog_buf, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
    return f"seccomp ({machine})"


def _audit_hook(workdir: str, block: set[str]) -> None:
    """Python-level refusals for what the missing kernel layers would have refused ("files": writes
    outside `workdir`; "processes"; "network"; "signals" to other processes). Not a boundary: native code is not seen by it, which
    is why it refuses ctypes too."""
    root = os.path.realpath(workdir)
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return True  # an open file descriptor: checked when it was opened
        real = os.path.realpath(os.fsdecode(path))  # type: ignore[arg-type]
        return real == root or real.startswith(root + os.sep) or real == "/dev/null"

    def hook(event: str, args: tuple) -> None:
        if event.startswith("ctypes."):
            raise PermissionError(f"the sandbox refuses ctypes ({event})")
        if "processes" in block and event in (
            "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen",
        ):  # fmt: skip
            raise PermissionError(f"the sandbox refuses new processes ({event})")
        if (
            "signals" in block
            and event in ("os.kill", "os.killpg")
            and args
            and args[0] not in (0, os.getpid())
        ):
            raise PermissionError(f"the sandbox signals no other process ({event} {args[0]})")
        if "network" in block and event in (
            "socket.__new__",
            "socket.connect",
            "socket.bind",
            "socket.sendto",
        ):
            if event != "socket.__new__" or (len(args) > 1 and args[1] != _AF_UNIX):
                raise PermissionError(f"the sandbox has no network ({event})")
        if "files" in block:
            if event == "open" and len(args) > 2:
                mode, flags = args[1], args[2]
                wants = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & writing
                )
                if wants and not inside(args[0]):
                    raise PermissionError(f"the sandbox writes only in its directory, not {args[0]!r}")
            elif event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
                           "os.chmod", "os.chown", "os.utime", "shutil.rmtree"):  # fmt: skip
                paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
                if not all(inside(p) for p in paths):
                    raise PermissionError(f"the sandbox writes only in its directory ({event} {paths[0]!r})")

    sys.addaudithook(hook)


def _confine_and_run(settings: dict, report_fd: int) -> None:
    """In the code's own process: confine, report what holds, close the report, run the code."""
    applied: list[str] = []
    layers = set(settings["layers"])
    workdir = settings["workdir"]
    missing = _limit(settings)
    applied.append("rlimits" if not missing else "rlimits (some)")
    try:
        os.chdir(workdir)
        if _LINUX and _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    except OSError as e:  # landlock and seccomp need no_new_privs: refuse to run the code
        _report(report_fd, fatal=f"{e}")
        os._exit(70)
    block = set()
    for name, layer, covers in (("landlock", lambda: _landlock(workdir), ("files",)),
                                ("seccomp", _seccomp, ("processes", "network"))):  # fmt: skip
        if name not in layers or not _LINUX:
            missing[name] = "not asked for" if _LINUX else f"Linux only ({sys.platform})"
            block.update(covers)
            continue
        try:
            applied.append(layer())
        except OSError as e:
            missing[name] = e.strerror or str(e)
            block.update(covers)
    # other processes' signals: out of reach in a pid namespace, or refused by landlock's scope (ABI 6)
    if "pidns" not in settings["namespaces"] and not any("+signals" in a for a in applied):
        block.add("signals")
    if block:
        _audit_hook(workdir, block)
        applied.append(f"audit hook ({', '.join(sorted(block))})")
    _report(report_fd, applied=applied, missing=missing)
    os.close(report_fd)
    with open("main.py", encoding="utf-8") as f:
        source = f.read()
    namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
    # Python ignores SIGXFSZ (a write past RLIMIT_FSIZE then fails with EFBIG, and a print loop that
    # catches it goes on): the kernel's default ends the process at the limit
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    status = 0
    try:
        exec(compile(source, "main.py", "exec"), namespace)  # noqa: S102 - the sandbox's purpose
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - the model's code: its traceback is the answer
        # from the code's first frame on: this file's frame would only confuse the model
        traceback.print_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _wait_and_report(pid: int, report_fd: int) -> None:
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        _report(report_fd, signal=os.WTERMSIG(status))
    else:
        _report(report_fd, exit=os.WEXITSTATUS(status))


def main() -> None:
    settings = json.loads(sys.argv[1])
    report_fd = settings["report_fd"]
    namespaces = []
    if "namespaces" in settings["layers"] and _LINUX:
        for flags, names in ((CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID, ["userns", "netns", "pidns"]),
                             (CLONE_NEWUSER | CLONE_NEWNET, ["userns", "netns"])):  # fmt: skip
            if _unshare(flags):
                namespaces = names
                break
    settings["namespaces"] = namespaces
    _report(report_fd, namespaces=namespaces)
    if "pidns" in namespaces:
        init = os.fork()  # pid 1 of the new namespace: when it ends, every process in it ends
        if init:
            _report(report_fd, kill_pid=init)
            os.waitpid(init, 0)
            return
        code = os.fork()
        if code == 0:
            _confine_and_run(settings, report_fd)
        _wait_and_report(code, report_fd)
        os._exit(0)
    code = os.fork()
    if code == 0:
        _confine_and_run(settings, report_fd)
    _report(report_fd, kill_pid=code)
    _wait_and_report(code, report_fd)


if __name__ == "__main__":
    main()
