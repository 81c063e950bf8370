"""The trusted program that `sandbox.run_tests` starts as `python -I -S -c HARNESS`.

It reads a JSON payload on stdin (`nonce`, `fd`, `code`, `tests`, `limits`, `uid`), locks itself
down (see `brorl.verifiers.sandbox` for what and why), then runs the candidate code once and each
test snippet in a copy of the candidate's globals, reporting on fd 3 one line per event, each
starting with the nonce: `ISO netns=<0|1>,fs=<0|1>,uid=<uid>`, `SYNTAX`, `CANDIDATE_RAISED <type>`,
`T<i> <0|1>`, `DONE`. It imports nothing outside the standard library and runs without `site`.
Before dropping privileges it imports every module that the candidate's and the tests' import
statements name (a line scan), because after the drop the stdlib may be unreadable.

Deliberately ignored: per-test time limits (the whole run has one wall-clock limit, as ProRL's
5 s total) and the candidate's exit code (only the tagged lines count).
"""

HARNESS = r'''
import json, os, resource, sys

# stdlib modules without import-time side effects that candidates may use; only these are
# imported (as root) ahead of the uid drop, and only when an import statement names them
PREIMPORTABLE = frozenset((
    "math cmath collections collections.abc itertools functools heapq bisect re string typing "
    "fractions decimal statistics json copy operator random datetime enum dataclasses array "
    "unicodedata textwrap io time socket threading subprocess pathlib signal ctypes os os.path "
    "sys queue struct hashlib base64 numbers abc contextlib types weakref pprint calendar "
    "encodings.idna"
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


CLONE_NEWNET, CLONE_NEWNS = 0x40000000, 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 262144
# the places an unprivileged uid may write on a usual Linux (world-writable, sticky)
SHADOWED = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


def isolate():
    """New network and mount namespaces: no interfaces; an empty root-owned tmpfs over each
    world-writable place (the cwd, opened before, stays the candidate's own directory).
    Returns (netns, fs): 1 where that isolation holds."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
    except Exception:
        return 0, 0
    netns = int(libc.unshare(CLONE_NEWNET) == 0)
    fs = int(libc.unshare(CLONE_NEWNS) == 0
             and libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0)
    if fs:
        mounted = [libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                              b"size=16k,mode=0755") == 0
                   for path in SHADOWED if os.path.isdir(path)]
        fs = int(all(mounted))
    return netns, fs


def lock_down(payload):
    # the stdlib may be unreadable once the uid is dropped: import what the code names first
    for name in imported_names([payload["code"]] + payload["tests"]):
        try:
            __import__(name)
        except Exception:
            pass
    netns, fs = isolate()
    limits = payload["limits"]
    R = resource
    R.setrlimit(R.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    for res, value in ((R.RLIMIT_AS, limits["memory_bytes"]),
                       (R.RLIMIT_NOFILE, limits["open_files"]),
                       (R.RLIMIT_FSIZE, limits["file_bytes"])):
        R.setrlimit(res, (value, value))
    if payload["uid"] is not None:
        os.setgroups([])
        os.setgid(payload["uid"])
        os.setuid(payload["uid"])
    R.setrlimit(R.RLIMIT_NPROC, (0, 0))
    return netns, fs


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

    netns, fs = lock_down(payload)
    emit("ISO", "netns=%d,fs=%d,uid=%d" % (netns, fs, os.getuid()))
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
    for i, test in enumerate(payload["tests"]):
        try:
            exec(compile(test, "<test %d>" % i, "exec"), dict(scope))
            ok = 1
        except BaseException:
            ok = 0
        emit("T%d" % i, ok)
    emit("DONE")


main()
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except BaseException:
        pass
os._exit(0)
'''
