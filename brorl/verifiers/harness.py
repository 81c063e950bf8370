"""The trusted program that `zygote.Zygote` starts once per verifier process as
`python -I -S -c HARNESS <control fd>`: a zygote that forks one locked-down sandbox per run.

The zygote imports every standard-library module a candidate may use (`PREIMPORTABLE`: after the
lock-down no file can be read), becomes a child subreaper with SIGCHLD ignored (every process it
or its descendants leave behind is reaped by the kernel at exit), says `ready` on its control
socket and then only waits for requests. Each request carries three file descriptors and no
data: a socket to the verifier, and the memfds for the candidate's stdout and stderr. For each it
forks a supervisor and closes its copies, so the zygote never holds a byte of any candidate's
code, subjects or nonce, and a fork of it carries nothing from an earlier run: every sandbox
starts from the same clean state (modules, globals, environment, file system).

The supervisor (still trusted, outside the sandbox) closes the control socket, dies with the
zygote (PR_SET_PDEATHSIG), reads its payload (`nonce`, `code`, `subjects`, `limits`, `uid`) from
the verifier's socket and locks down:

1. new network, mount and PID namespaces (`unshare`; as a non-root user inside a new user
   namespace, where the kernel allows it);
2. a fork: the child is PID 1 of the new PID namespace, so no process of the candidate's can see
   or signal any process outside it (another rollout's sandbox, the verifier), and when it ends
   the kernel kills everything left inside; the supervisor sends the verifier the result pipe's
   read end (and the child's pid, whose run delays the verifier's clock subtracts:
   `brorl.verifiers.clock`), then waits for that child, killing it (SIGKILL, to a child it has
   not reaped: no pid-reuse race) as soon as the verifier's end of the socket closes (its
   time-out, or the verifier gone), and exits: the result pipe's EOF tells the verifier every
   process of the run has ended;
3. there, a size-limited tmpfs (`SandboxLimits.disk_bytes`, `max_files` inodes) mounted over the
   working directory and `chroot` into it: the candidate's whole file system is that empty,
   capped directory (no data, no test files, no /proc, nothing to fill);
4. a second fork for the candidate, so it is not PID 1 (which the kernel shields from signals);
   PID 1 waits for it and reports `CPU_LIMIT` when its CPU limit killed it (also where no
   namespace could be made: then the first child forks it the same way). The candidate sets
   RLIMIT_CPU, RLIMIT_AS, RLIMIT_NOFILE, RLIMIT_FSIZE, drops to the unprivileged uid with
   no groups, sets RLIMIT_NPROC to 0 (no fork, no threads), runs the candidate's code once and
   evaluates each subject in a copy of its globals.

The candidate has fd 0 (/dev/null), 1 and 2 (the memfds, capped by RLIMIT_FSIZE) and 3 (the
result pipe) and nothing else. It reports on fd 3 one line per event, each starting with the
nonce: `ISO <isolation>`, `SYNTAX`, `CANDIDATE_RAISED <type>`, `V<i> <encoded value>` (or
`V<i> !` when evaluating it raised, `V<i> ?` when its value is not plain data), `DONE`, and
from PID 1 `CPU_LIMIT` (a forged one only turns the candidate's own verdict into `timeout`).
Values are encoded by `encode`, in which only the exact built-in types exist; the judge
(`brorl.verifiers.checks`) decodes and compares them in its own process, against expected values
that never enter this one. It imports nothing outside the standard library and runs without
`site`.

Deliberately ignored: per-test time limits (the whole run has one time limit, as ProRL's 5 s
total) and the candidate's exit code (only the tagged lines count).
"""

HARNESS = r'''
import json, os, resource, select, signal, socket, sys

# stdlib modules without import-time side effects that candidates may use: the zygote imports
# them all once; the candidate finds them in sys.modules (nothing else can be read in the jail)
PREIMPORTABLE = (
    "math cmath collections collections.abc itertools functools heapq bisect re string typing "
    "fractions decimal statistics json copy operator random datetime enum dataclasses array "
    "unicodedata textwrap io time socket threading subprocess pathlib signal ctypes os os.path "
    "sys queue struct hashlib base64 numbers abc contextlib types weakref pprint calendar "
    "encodings.idna builtins gc inspect traceback"
).split()

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 262144
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


def write_file(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def unshare(c):
    """New mount, network and PID namespaces; returns whether they hold and whether this process
    may still change uid (root outside, or mapped root inside a new user namespace)."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
    if os.geteuid() == 0:
        return c.unshare(flags) == 0, True
    uid, gid = os.geteuid(), os.getegid()
    if c.unshare(flags | CLONE_NEWUSER) != 0:
        return False, False
    try:
        write_file("/proc/self/setgroups", "deny")
        write_file("/proc/self/uid_map", "0 %d 1" % uid)
        write_file("/proc/self/gid_map", "0 %d 1" % gid)
    except OSError:
        return True, False
    return True, False


def jail(c, limits, uid):
    """In the new namespaces: a private, capped tmpfs as the whole file system."""
    if c.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    options = "size=%d,nr_inodes=%d,mode=0700" % (limits["disk_bytes"], limits["max_files"])
    if uid is not None:
        options += ",uid=%d,gid=%d" % (uid, uid)
    here = os.getcwd().encode()
    if c.mount(b"tmpfs", here, b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options.encode()) != 0:
        return False
    os.chdir(here)
    os.chroot(".")
    os.chdir("/")
    return True


def set_limits(limits, uid):
    R = resource
    R.setrlimit(R.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    for res, value in ((R.RLIMIT_AS, limits["memory_bytes"]),
                       (R.RLIMIT_NOFILE, limits["open_files"]),
                       (R.RLIMIT_FSIZE, limits["file_bytes"])):
        R.setrlimit(res, (value, value))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    R.setrlimit(R.RLIMIT_NPROC, (0, 0))


def wait_exit(pid):
    """Wait for `pid`, then leave at once (no clean-up that could run the candidate's code)."""
    while True:
        try:
            os.waitpid(pid, 0)
            break
        except ChildProcessError:
            break
        except InterruptedError:
            continue
    os._exit(0)


def wait_candidate(pid, cpu_s, emit):
    """Wait for the candidate; say `CPU_LIMIT` when its CPU limit killed it (SIGXCPU at the soft
    limit, SIGKILL at the hard one), then leave at once."""
    while True:
        try:
            _, status, usage = os.wait4(pid, 0)
            break
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL
                                     and usage.ru_utime + usage.ru_stime >= cpu_s):
            emit("CPU_LIMIT")
    os._exit(0)


PLAIN = (type(None), bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)


def encode(value, depth=0):
    """The plain encoding of `value`: exact built-in types only (no subclass), depth <= 64."""
    kind = type(value)
    if depth > 64 or kind not in PLAIN:
        raise TypeError("not plain data")
    if value is None:
        return ["n"]
    if kind is bool:
        return ["b", value]
    if kind is int:
        return ["i", str(value)]
    if kind is float:
        return ["f", value.hex()]
    if kind is complex:
        return ["c", value.real.hex(), value.imag.hex()]
    if kind is str:
        return ["s", value]
    if kind is bytes:
        return ["y", value.hex()]
    if kind is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}[kind]
    return [tag, [encode(item, depth + 1) for item in value]]


def read_payload(channel):
    """The run's payload: an 8-byte length, then that many bytes of JSON."""
    data = b""
    while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "big"):
        chunk = channel.recv(1 << 16)
        if not chunk:
            raise EOFError("the verifier closed the channel")
        data += chunk
    return json.loads(data[8:].decode())


def supervise(c, control, fds, zygote_pid):
    """A run's supervisor, forked from the zygote: lock down, fork the sandbox, report it."""
    c.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != zygote_pid:
        os._exit(0)  # the zygote is gone already
    control.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    channel, out, err = socket.socket(fileno=fds[0]), fds[1], fds[2]
    payload = read_payload(channel)
    read_end, write_end = os.pipe()
    try:
        spaced, may_setuid = unshare(c)
    except Exception:
        spaced, may_setuid = False, False
    alive_r, alive_w = os.pipe()  # EOF when this supervisor is gone
    pid = os.fork()
    if pid == 0:
        try:
            channel.close()
            os.close(read_end)
            os.close(alive_w)
            c.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if select.select([alive_r], [], [], 0)[0]:
                os._exit(0)  # the supervisor died before the line above
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.dup2(write_end, 3)
            os.closerange(4, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            sandbox(c, payload, spaced, may_setuid)
        finally:
            flush_and_exit()
    os.close(write_end)
    socket.send_fds(channel, [b"H%d" % pid], [read_end])  # its pid: the verifier's clock
    for fd in (read_end, out, err, alive_r):
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    if channel not in select.select([channel, pidfd], [], [])[0]:
        wait_exit(pid)  # the sandbox ended by itself
    os.kill(pid, signal.SIGKILL)  # the verifier's end closed (its time-out): the whole namespace
    wait_exit(pid)


def sandbox(c, payload, spaced, may_setuid):
    """In the new namespaces: the jail, then the candidate in a child of its own."""
    nonce = payload["nonce"]

    def emit(tag, value=""):
        try:
            os.write(3, (nonce + " " + tag + " " + str(value) + "\n").encode())
        except OSError:
            pass

    limits, uid = payload["limits"], payload["uid"]
    os.setsid()  # a process group of its own: killpg(0) is not confined by the PID namespace
    jailed = jail(c, limits, uid if may_setuid else None) if spaced else False
    pid = os.fork()
    if pid:  # PID 1 of the namespace: the candidate runs in a child of its own
        wait_candidate(pid, limits["cpu_s"], emit)
    uid = uid if may_setuid else None
    set_limits(limits, uid)
    emit("ISO", "ns=%d,fs=%d,uid=%d" % (spaced, jailed, os.getuid()))
    try:
        code = compile(payload["code"], "<candidate>", "exec")
    except (SyntaxError, ValueError):
        emit("SYNTAX")
        return
    scope = {"__name__": "candidate", "__builtins__": __builtins__}
    try:
        exec(code, scope)
    except BaseException as exc:
        emit("CANDIDATE_RAISED", type(exc).__name__)
        return
    for i, subject in enumerate(payload["subjects"]):
        try:
            value = eval(compile(subject, "<test %d>" % i, "eval"), dict(scope))
        except BaseException:
            emit("V%d" % i, "!")
            continue
        try:
            wire = json.dumps(encode(value), separators=(",", ":"))
        except BaseException:
            wire = "?"
        emit("V%d" % i, wire)
    emit("DONE")


def flush_and_exit():
    """Leave at once after flushing what the candidate printed (no other clean-up)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(0)


def zygote(control_fd):
    """Import what candidates may use, then fork a supervisor for each request until the
    verifier closes the control socket."""
    import ctypes
    c = ctypes.CDLL(None, use_errno=True)
    c.prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps every child at once
    for name in PREIMPORTABLE:
        try:
            __import__(name)
        except Exception:
            pass
    control = socket.socket(fileno=control_fd)
    control.sendall(b"ready")
    me = os.getpid()
    while True:
        message, fds, _, _ = socket.recv_fds(control, 16, 3)
        if not message:  # the verifier is gone: each supervisor dies with this process
            try:
                os.rmdir(os.getcwd())
            except OSError:
                pass
            os._exit(0)
        if message == b"R" and len(fds) == 3:
            if os.fork() == 0:
                try:
                    supervise(c, control, fds, me)
                finally:
                    os._exit(0)
        for fd in fds:
            os.close(fd)


zygote(int(sys.argv[1]))
'''
