"""The trusted program that `sandbox.run_code` starts as `python -I -S -c HARNESS`.

It reads a JSON payload on stdin (`nonce`, `fd`, `code`, `subjects`, `limits`, `uid`), imports
the standard-library modules the candidate's import statements name (a line scan against an
allow-list: after the lock-down no file can be read), then locks itself down:

1. new network, mount and PID namespaces (`unshare`; as a non-root user inside a new user
   namespace, where the kernel allows it);
2. a fork: the child is PID 1 of the new PID namespace, so no process of the candidate's can see
   or signal any process outside it (another rollout's sandbox, the verifier), and when it ends
   the kernel kills everything left inside; this process waits for it, and on SIGTERM (the
   verifier's time-out) kills it first, so that every process of the run is reaped;
3. there, a size-limited tmpfs (`SandboxLimits.disk_bytes`, `max_files` inodes) mounted over the
   working directory and `chroot` into it: the candidate's whole file system is that empty,
   capped directory (no data, no test files, no /proc, nothing to fill);
4. a second fork for the candidate, so it is not PID 1 (which the kernel shields from signals);
   it sets RLIMIT_CPU, RLIMIT_AS, RLIMIT_NOFILE, RLIMIT_FSIZE, drops to the unprivileged uid with
   no groups, sets RLIMIT_NPROC to 0 (no fork, no threads), runs the candidate's code once and
   evaluates each subject in a copy of its globals.

It reports on fd 3 one line per event, each starting with the nonce: `ISO <isolation>`,
`SYNTAX`, `CANDIDATE_RAISED <type>`, `V<i> <encoded value>` (or `V<i> !` when evaluating it
raised, `V<i> ?` when its value is not plain data), `DONE`. Values are encoded by `encode`, in
which only the exact built-in types exist; the judge (`brorl.verifiers.checks`) decodes and
compares them in its own process, against expected values that never enter this one. It imports
nothing outside the standard library and runs without `site`.

Deliberately ignored: per-test time limits (the whole run has one wall-clock limit, as ProRL's
5 s total) and the candidate's exit code (only the tagged lines count).
"""

HARNESS = r'''
import json, os, resource, signal, sys

# stdlib modules without import-time side effects that candidates may use; only these are
# imported ahead of the lock-down, and only when an import statement names them
PREIMPORTABLE = frozenset((
    "math cmath collections collections.abc itertools functools heapq bisect re string typing "
    "fractions decimal statistics json copy operator random datetime enum dataclasses array "
    "unicodedata textwrap io time socket threading subprocess pathlib signal ctypes os os.path "
    "sys queue struct hashlib base64 numbers abc contextlib types weakref pprint calendar "
    "encodings.idna builtins gc inspect traceback"
).split())


def imported_names(sources):
    """Allowed modules named by import statements in the sources (a line scan, no parsing)."""
    names = []
    for source in sources:
        for line in source.replace(";", "\n").splitlines():
            words = line.replace(",", " , ").split()
            if len(words) >= 2 and words[0] == "from":
                names.append(words[1])
            elif words[:1] == ["import"]:
                expect = True
                for word in words[1:]:
                    if expect and word not in (",", "as"):
                        names.append(word)
                    expect = word == ","
    if "socket" in names:
        names.append("encodings.idna")
    return [name for name in names if name in PREIMPORTABLE]


CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 262144


def libc():
    import ctypes
    return ctypes.CDLL(None, use_errno=True)


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


CHILD = []


def on_term(signum, frame):
    """The verifier's time-out (SIGTERM): kill the child, so this process reaps it and exits."""
    for pid in CHILD:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def wait_exit(pid):
    """Wait for `pid`, then leave at once (no clean-up that could run the candidate's code)."""
    CHILD.append(pid)
    while True:
        try:
            os.waitpid(pid, 0)
            break
        except ChildProcessError:
            break
        except InterruptedError:
            continue
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


def main():
    payload = json.loads(sys.stdin.buffer.read().decode())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(payload["fd"], 3)
    if payload["fd"] != 3:
        os.close(payload["fd"])
    nonce = payload["nonce"]

    def emit(tag, value=""):
        try:
            os.write(3, (nonce + " " + tag + " " + str(value) + "\n").encode())
        except OSError:
            pass

    # after the lock-down no file can be read: import what the code names first
    for name in imported_names([payload["code"]]):
        try:
            __import__(name)
        except Exception:
            pass
    limits, uid = payload["limits"], payload["uid"]
    try:
        c = libc()
        spaced, may_setuid = unshare(c)
    except Exception:
        c, spaced, may_setuid = None, False, False
    if spaced:
        signal.signal(signal.SIGTERM, on_term)
        pid = os.fork()
        if pid:
            wait_exit(pid)  # the PID namespace's init runs in the child
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        jailed = jail(c, limits, uid if may_setuid else None)
        pid = os.fork()
        if pid:
            wait_exit(pid)  # init: the candidate runs in a child of its own
    else:
        jailed = False
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


main()
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except BaseException:
        pass
os._exit(0)
'''
