"""The child side of one sandboxed run: a standalone stdlib script (run as ``python -I jail.py FD``).

Three processes, because a new PID namespace only applies to the children of the process that
creates it:

- the *jail* (this script as started by the pool, outside the namespaces) reads the run's spec
  from stdin, joins the run's memory cgroup (if any), ``unshare``s new network/PID/mount/IPC/UTS
  namespaces and forks
- the *init* (PID 1 of the new namespace, still root) mounts a private /proc and a size-limited
  tmpfs on /tmp (the working directory; /var/tmp and /dev/shm are the same tmpfs), writes the
  code and files there, forks the program, reaps everything, ends the run when the namespace
  reaches the process limit, and writes the program's status as JSON to fd ``FD``. When it
  exits the kernel kills every process left in the namespace (daemons included)
- the *program* sets its rlimits, drops to an unprivileged uid/gid and ``exec``s the
  interpreter with a scrubbed environment; stdin is the rest of the jail's stdin (after the
  spec), stdout/stderr are the pool's pipes

The new network namespace has only a loopback interface that is down: no address, no route,
so every ``connect`` fails. Without namespaces (``"isolate": false``) the init kills what is
left of the program's process group instead, best effort.

``python -I jail.py --probe`` prints which isolation works here as one JSON line.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added in Linux 5.12)
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
NAMESPACES = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS

libc = ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def unshare(flags):
    _check(libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source, target, fstype, flags, data=None):
    _check(libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                      ctypes.c_ulong(flags), data and data.encode()), f"mount {target}")


def enter_namespaces():
    """New namespaces for this process's children; as non-root, inside a new user namespace."""
    if os.geteuid() == 0:
        unshare(NAMESPACES)
        return
    uid, gid = os.geteuid(), os.getegid()
    unshare(NAMESPACES | CLONE_NEWUSER)
    with open("/proc/self/setgroups", "w") as handle:
        handle.write("deny")
    with open("/proc/self/uid_map", "w") as handle:
        handle.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as handle:
        handle.write(f"0 {gid} 1")


def read_exact(fd, count):
    chunks = []
    while count:
        chunk = os.read(fd, min(count, 1 << 20))
        if not chunk:
            raise EOFError("the pool closed stdin before the whole spec arrived")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def read_spec():
    # "<length>\n<json>": read byte by byte up to the newline so nothing of the program's
    # stdin (which follows the spec) is consumed here.
    header = b""
    while not header.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            raise EOFError("the pool closed stdin before the spec header")
        header += byte
    return json.loads(read_exact(0, int(header)))


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def make_read_only(path):
    """Every mount at or below ``path`` read-only and nosuid, in this mount namespace only."""
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    result = libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), path.encode(),
                          ctypes.c_uint(AT_RECURSIVE), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    _check(result, f"mount_setattr {path}")


def hide(mounts):
    """Show each directory as an empty tmpfs, with the listed paths below it bound back (the
    interpreter's prefix under /root, a venv inside a hidden repository)."""
    for directory, keep in mounts:
        tmpfs_keeping(directory, "size=1m,mode=0755", keep)


def tmpfs_keeping(directory, options, keep):
    """Mount a tmpfs on ``directory`` and bind the directories ``keep`` (paths below it) back into
    it: they are opened before the tmpfs covers them."""
    sources = [os.open(path, os.O_PATH | os.O_DIRECTORY) for path in keep]
    try:
        mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, options)
        for path, source in zip(keep, sources):
            os.makedirs(path, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{source}", path, None, MS_BIND | MS_REC)
    finally:
        for source in sources:
            os.close(source)


def prepare_workdir(spec):
    """Mount the private tmpfs (isolated) or use the pool's directory; write the code and files."""
    uid, gid = spec["uid"], spec["gid"]
    if spec["isolate"]:
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        hide(spec["hide"])
        # The whole filesystem read-only (then only the tmpfs below is writable): a directory the
        # program's uid may write to (mode 0777 somewhere) is still out of reach.
        try:
            make_read_only("/")
        except OSError:  # a kernel before 5.12: at least the root mount itself
            mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
        workdir = "/tmp"
        options = f"size={spec['workdir_bytes']},mode=0700"
        if uid is not None:
            options += f",uid={uid},gid={gid}"
        # An interpreter installed under /tmp (a checkout's venv there) would vanish under the
        # tmpfs: its directories are bound back inside it, read-only like the rest.
        tmpfs_keeping(workdir, options, spec["workdir_keep"])
        for other in ("/var/tmp", "/dev/shm"):
            if os.path.isdir(other):
                try:
                    mount(workdir, other, None, MS_BIND)
                except OSError:
                    pass  # not worth failing the run: it only narrows where the program can write
    else:
        workdir = spec["host_workdir"]
    return workdir


def write_files(spec, workdir):
    uid, gid = spec["uid"], spec["gid"]
    for relative, text in spec["files"].items():
        path = os.path.join(workdir, relative)
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        with open(path, "w", encoding="utf-8", errors="surrogatepass") as handle:
            handle.write(text)
    if uid is not None:
        for root, dirs, names in os.walk(workdir):
            dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(root, d))]  # a bound-back interpreter
            for name in dirs + names:
                path = os.path.join(root, name)
                if spec["workdir_keep"] and any(keep.startswith(path + "/") for keep in spec["workdir_keep"]):
                    continue  # a directory leading to a bound-back interpreter: root's, read-only below
                os.lchown(path, uid, gid)
        os.chown(workdir, uid, gid)


def exec_program(spec, workdir, status_fd):
    try:
        os.close(status_fd)
        os.chdir(workdir)
        limits = spec["rlimits"]
        for name, value in limits.items():
            if name != "CPU":
                resource.setrlimit(getattr(resource, "RLIMIT_" + name), (value, value))
        # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL one second later if it is caught.
        resource.setrlimit(resource.RLIMIT_CPU, (limits["CPU"], limits["CPU"] + 1))
        set_oom_score_adj(0)
        # setuid binaries (su, mount, ...) cannot give the program privileges back.
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        if spec["uid"] is not None:
            os.setgroups([])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
        for sig in (signal.SIGCHLD, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.execve(spec["argv"][0], spec["argv"], spec["env"])
    except BaseException as error:  # noqa: BLE001 - anything here must end this child, not return
        try:
            os.write(2, f"sandbox: could not start {spec['argv'][0]}: {error}\n".encode())
        finally:
            os._exit(127)


def set_oom_score_adj(value):
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write(str(value))
    except OSError:
        pass  # best effort: not root, or a machine that refuses it (this one does); the pool then
        # reads the cgroup's OOM count to report "memory" even if the jail itself was killed


def count_processes():
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


def kill_process_group_except(pgid, keep):
    """Without a PID namespace: SIGKILL what is left in the program's process group."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in keep:
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                os.kill(int(name), signal.SIGKILL)
        except (OSError, IndexError, ValueError):
            pass


def supervise(spec, status_fd):
    """The init: start the program, reap, enforce the process limit, report the status."""
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD, signal.SIGUSR1])
    # If the jail dies (the pool killed it), this process learns it through SIGUSR1.
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGUSR1), "prctl")
    status = {"exit_code": None, "signal": None, "cpu_s": 0.0, "processes_exceeded": False, "error": None}
    try:
        workdir = prepare_workdir(spec)
    except BaseException as error:  # noqa: BLE001
        status["error"] = f"could not prepare the working directory: {error}"
        os.write(status_fd, json.dumps(status).encode())
        os._exit(1)
    try:
        write_files(spec, workdir)
    except OSError as error:  # the caller's files do not fit (a file where a directory must be, no space)
        status["error"], status["bad_request"] = f"files: could not write them: {error}", True
        os.write(status_fd, json.dumps(status).encode())
        os._exit(1)
    program = os.fork()
    if program == 0:
        exec_program(spec, workdir, status_fd)
    os.close(0)
    isolated = spec["isolate"]
    limit = spec["processes"]
    while True:
        info = signal.sigtimedwait([signal.SIGCHLD, signal.SIGUSR1], 0.05)
        if info is not None and info.si_signo == signal.SIGUSR1:
            break  # the pool is gone: end everything
        finished = False
        while True:
            try:
                pid, wait_status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                finished = True
                break
            if pid == 0:
                break
            if pid == program:
                if os.WIFSIGNALED(wait_status):
                    status["signal"] = os.WTERMSIG(wait_status)
                else:
                    status["exit_code"] = os.waitstatus_to_exitcode(wait_status)
                status["cpu_s"] = usage.ru_utime + usage.ru_stime
                finished = True
        if finished:
            break
        # Counted in the namespace's own /proc: this init plus everything the program started.
        if isolated and count_processes() - 1 >= limit:
            status["processes_exceeded"] = True
            os.kill(-1, signal.SIGKILL)  # from PID 1: every process of the namespace but this one
    if not isolated:
        kill_process_group_except(os.getpgid(0), {os.getpid(), os.getppid()})
    os.write(status_fd, json.dumps(status).encode())
    os._exit(0)


def probe():
    report = {"euid": os.geteuid(), "namespaces": False, "user_namespace": os.geteuid() != 0, "error": None}
    try:
        enter_namespaces()
        report["namespaces"] = True
    except OSError as error:
        report["error"] = str(error)
    print(json.dumps(report), flush=True)


def main():
    if sys.argv[1:] == ["--probe"]:
        probe()
        return
    status_fd = int(sys.argv[1])
    spec = read_spec()
    set_oom_score_adj(-1000)  # when the run's cgroup is full, the OOM killer takes the program, not us
    try:
        if spec["cgroup_procs"]:  # before forking: the init and the program start inside it
            with open(spec["cgroup_procs"], "w") as handle:
                handle.write(str(os.getpid()))
        if spec["isolate"]:
            enter_namespaces()
    except OSError as error:
        status = {"exit_code": None, "signal": None, "cpu_s": 0.0, "processes_exceeded": False,
                  "error": f"could not isolate the run: {error}"}
        os.write(status_fd, json.dumps(status).encode())
        sys.exit(1)
    init = os.fork()
    if init == 0:
        supervise(spec, status_fd)
    os.close(status_fd)
    os.close(0)  # only the program reads the rest of stdin
    while True:
        try:
            os.waitpid(init, 0)
            break
        except InterruptedError:
            continue


if __name__ == "__main__":
    main()
