"""Server time per script call (issue 25): what each hot script costs a node, beside the
minimal Redlock's ``SET NX PX`` and compare-and-delete, measured in one run on one node.

Run: ``python -m benchmarks.script_cost [--calls 20000] [--repeat 3] [--binary PATH]``, or
``python -m benchmarks.script_cost --callgrind --calls 2000 --repeat 1`` (about a minute).

How: a fresh node (``LocalNode``, Valkey by default, ``--binary $(which redis-server)`` for
Redis 7), one raw connection. Each case first writes what it needs (not measured), then
``CONFIG RESETSTAT``, then ``--calls`` commands pipelined in batches, each on its own key, then
``INFO commandstats``: the ``usec_per_call`` of the command sent (EVALSHA or SET). A script's
figure includes the commands it calls (listed after it, calls and µs per script call, to show
where the time goes). The commands are the library's own encoders (``wire/scripts.py``),
completed with the connection's identity as the transport does, so the node runs what a
client sends.

Units: µs of server time per call (the server's own clock: not the round trip, not the
client), and the server process's CPU per call (µs), each the least of ``--repeat`` runs.
On a shared 2-core machine both move by up to 2x between runs: compare the cases of one run.
``--callgrind`` runs the server under valgrind and reports its instructions per call (kIr,
thousands) instead of CPU: they do not move with the machine's load (its µs columns are then
valgrind's, ~50x slow).

``--split`` (with ``--callgrind``) also says where each call's instructions go, from the
server's own function names (so it needs a server binary that has them: Redis 7's
``redis-server`` does, through its dynamic symbols; the bundled Valkey is stripped, and
``--split`` then uses ``redis-server`` unless ``--binary`` names another):

- ``commands``: the commands the script calls, run by the server (``scriptCall``);
- ``replies``: their replies made into Lua values (``parseReply``);
- ``Lua``: the script's own code, everything else inside ``lua_pcall`` (the Lua VM, string
  and number work, building each ``redis.call``'s arguments);
- ``KEYS/ARGV``: the rest of ``luaCallFunction``: the script's KEYS and ARGV tables, the
  reply to the client, and the Lua collector's step after each call (``lua_gc``, also
  shown on its own);
- ``request``: outside the script: reading and parsing the request, finding the script,
  the event loop.

``python -m benchmarks.script_cost --callgrind --split --calls 2000 --repeat 1``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import hiredis

from benchmarks.minimal_redlock import COMPARE_AND_DELETE, SHA
from django_redlock.localnodes import LocalNode, server_version
from django_redlock.wire import scripts
from django_redlock.wire.resp import encode_command
from django_redlock.wire.setup import history_of, identity_of

BATCH = 500
# The plain Redlock's renewal: KEYS[1] the key, ARGV[1] the token, ARGV[2] the ttl in ms.
COMPARE_AND_PEXPIRE = (
    b'if redis.call("get", KEYS[1]) == ARGV[1] then '
    b'return redis.call("pexpire", KEYS[1], ARGV[2]) else return 0 end'
)
TTL_MS = 600_000  # long: nothing expires during a case, even under valgrind
QUARANTINE_MS = 60_000
LIFETIME_MS = 600_000  # long: no place in line lapses during a case
# An owner argument as core/owner.py makes it: '<7-char id><acquired_at base 36> <record>'.
OWNER = (
    'AbCdEfGmfx2k3q1 {"host": "bench-host", "pid": 4242, "thread": "MainThread", '
    '"task": null, "origin": null, "acquired_at": '
)


class Node:
    """One connection to the node, pipelining commands and reading their replies."""

    def __init__(self, path: str, counted: int | None = None, split: bool = False) -> None:
        # The pid of a server run under callgrind: its instructions are counted instead of
        # its CPU time.
        self.counted = counted
        # --split: where the instructions counted by the last dump went (see _inclusive).
        self.split = split
        self.last_split: dict[str, int] = {}
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.reader = hiredis.Reader()

    def run(self, commands: list[bytes]) -> list[object]:
        """Send ``commands`` in batches; their replies in order (errors as values)."""
        replies: list[object] = []
        for start in range(0, len(commands), BATCH):
            batch = commands[start : start + BATCH]
            self.sock.sendall(b"".join(batch))
            while len(replies) < start + len(batch):
                reply = self.reader.gets()
                if reply is False:
                    self.reader.feed(self.sock.recv(1 << 16))
                else:
                    replies.append(reply)
        return replies

    def call(self, *parts: bytes | str | int) -> object:
        return self.run([encode_command(*parts)])[0]

    def cpu(self) -> float:
        """The server process's CPU time so far (user + system), in seconds; under
        callgrind, its instructions since the last call, in thousands."""
        if self.counted is not None:
            return self.instructions()
        text = self.call("INFO", "cpu")
        assert isinstance(text, bytes)
        fields = dict(line.split(":", 1) for line in text.decode().splitlines() if ":" in line)
        return float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"])

    def instructions(self) -> float:
        """Under callgrind: the server's instructions (thousands) since the last call."""
        dumps = Path(f"/proc/{self.counted}/cwd").resolve()
        before = set(dumps.glob("callgrind.out.*"))
        subprocess.run(
            ["callgrind_control", "-d", str(self.counted)], check=True, capture_output=True
        )
        (new,) = set(dumps.glob("callgrind.out.*")) - before
        totals = [line for line in new.read_text().splitlines() if line.startswith("totals:")]
        if self.split:
            self.last_split = _inclusive(new)
        new.unlink()
        return int(totals[0].split()[1]) / 1000

    def stats(self) -> dict[str, tuple[int, float]]:
        """commandstats: command -> (calls, usec)."""
        text = self.call("INFO", "commandstats")
        assert isinstance(text, bytes)
        out: dict[str, tuple[int, float]] = {}
        for line in text.decode().splitlines():
            if not line.startswith("cmdstat_"):
                continue
            name, _, rest = line.partition(":")
            fields = dict(item.split("=") for item in rest.split(","))
            out[name[len("cmdstat_") :]] = (int(fields["calls"]), float(fields["usec"]))
        return out


# The server functions --split reads (inclusive instructions): see the module docstring.
_SPLIT_FUNCTIONS = ("luaCallFunction", "lua_pcall", "scriptCall", "parseReply", "lua_gc")
_ANNOTATED = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+\S*?:(\w+) \[")


def _inclusive(dump: Path) -> dict[str, int]:
    """The inclusive instructions of each of ``_SPLIT_FUNCTIONS`` in a callgrind dump."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(dump)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found: dict[str, int] = {}
    for line in text.splitlines():
        match = _ANNOTATED.match(line)
        if match and match[2] in _SPLIT_FUNCTIONS and match[2] not in found:
            found[match[2]] = int(match[1].replace(",", ""))
    return found


def _split_text(found: dict[str, int], total_kir: float, calls: int) -> str:
    """``found`` (see _inclusive) as kIr per call in the parts the module docstring names."""
    if "luaCallFunction" not in found or "lua_pcall" not in found:
        return "split: this server's symbols do not name its Lua functions"
    # A script that calls no command has no scriptCall or parseReply: 0 for them.
    per = {name: found.get(name, 0) / 1000 / calls for name in _SPLIT_FUNCTIONS}
    parts = {
        "commands": per["scriptCall"],
        "replies": per["parseReply"],
        "Lua": per["lua_pcall"] - per["scriptCall"] - per["parseReply"],
        "KEYS/ARGV": per["luaCallFunction"] - per["lua_pcall"],
        "request": total_kir - per["luaCallFunction"],
    }
    shown = ", ".join(f"{name} {value:.1f}" for name, value in parts.items())
    return f"split kIr/call: {shown} (lua_gc {per['lua_gc']:.1f})"


def _replies_ok(replies: list[object], expect: Callable[[object], bool], case: str) -> None:
    bad = [reply for reply in replies if not expect(reply)]
    if bad:
        raise SystemExit(f"{case}: unexpected replies, e.g. {bad[0]!r} ({len(bad)} of them)")


def measure(
    node: Node,
    case: str,
    command: str,
    setup: list[bytes],
    measured: list[bytes],
    expect: Callable[[object], bool],
) -> tuple[str, float, float, str]:
    """Run ``setup``, reset the stats, run ``measured``; the µs per ``command`` call and the
    nested commands per call."""
    node.run(setup)
    node.call("CONFIG", "RESETSTAT")
    cpu = node.cpu()
    replies = node.run(measured)
    cpu = node.cpu() - (0 if node.counted else cpu)
    stats = node.stats()
    _replies_ok(replies, expect, case)
    calls, usec = stats[command]
    inner = {
        name: value for name, value in stats.items() if name not in (command, "config|resetstat")
    }
    nested = ", ".join(
        f"{name} {count / calls:.1f}x {spent / calls:.2f}"
        for name, (count, spent) in sorted(inner.items())
    )
    inside = sum(spent for _, spent in inner.values()) / calls
    per_call = cpu / len(measured) if node.counted else cpu * 1e6 / len(measured)
    text = f"commands {inside:.2f} us: {nested}"
    if node.split and node.last_split and command == "evalsha":
        text += "; " + _split_text(node.last_split, per_call, len(measured))
    return case, usec / calls, per_call, text


class Counted(LocalNode):
    """A node run under valgrind's callgrind (instructions counted, dumped on demand)."""

    def _arguments(self) -> list[str]:
        return [
            "valgrind",
            "--tool=callgrind",
            "--collect-systime=no",
            # Every dump names its functions in full (else a later dump refers to names by
            # numbers that only an earlier dump defines, and --split cannot read it).
            "--compress-strings=no",
            f"--callgrind-out-file={self.directory}/callgrind.out.%p",
            *super()._arguments(),
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs; the least figure is kept")
    parser.add_argument("--binary", default=None, help="server binary (default: Valkey)")
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="run the server under valgrind: count its instructions per call (kIr), which "
        "do not move with the machine's load (use fewer --calls: it runs ~50x slower)",
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="with --callgrind: where each call's instructions go (needs a server binary "
        "with function names: redis-server unless --binary names another)",
    )
    options = parser.parse_args()
    calls = options.calls
    if options.split:
        if not options.callgrind:
            parser.error("--split needs --callgrind")
        if options.binary is None:
            options.binary = shutil.which("redis-server")
            if options.binary is None:
                parser.error("--split needs a server with function names: pass --binary")

    with tempfile.TemporaryDirectory(prefix="rl-", dir="/tmp") as directory:
        server = (Counted if options.callgrind else LocalNode)(
            Path(directory), binary=options.binary
        )
        server.start()
        try:
            print(f"server: {server_version(server.binary)}; {calls} calls per case")
            node = Node(
                server.socket_path, server.pid if options.callgrind else None, options.split
            )
            runs = [run_cases(node, calls, f"r{run}:") for run in range(options.repeat)]
        finally:
            server.stop()
    # The least of the runs: the server's time is only ever inflated (by other processes
    # taking the core), never deflated.
    width = max(len(row[0]) for row in runs[0])
    unit = "server kIr/call" if options.callgrind else "server CPU us/call"
    print(f"{'case':<{width}}  script us/call  {unit}  (least of {len(runs)} runs)")
    for rows in zip(*runs, strict=True):
        best = min(rows, key=lambda row: row[1])
        cpu = min(row[2] for row in rows)
        print(f"{best[0]:<{width}}  {best[1]:8.2f}  {cpu:8.2f}   [{best[3]}]")


def run_cases(node: Node, calls: int, prefix: str) -> list[tuple[str, float, float, str]]:
    # The server's own timers (serverCron, the active expiry of the keys the cases leave)
    # run by the clock, so a case that runs longer on a loaded machine would be charged more
    # of them: slowed to once a second, and no active expiry (nothing expires here anyway).
    node.call("CONFIG", "SET", "hz", "1")
    node.call("DEBUG", "SET-ACTIVE-EXPIRE", "0")
    for script in scripts.HOT_SCRIPTS:
        node.call("SCRIPT", "LOAD", script.source)
    assert node.call("SCRIPT", "LOAD", COMPARE_AND_DELETE) == SHA
    info = node.call("INFO", "server")
    assert isinstance(info, bytes)
    run_id = info.split(b"run_id:")[1].split(b"\r\n")[0].decode()
    history = history_of(node.call("INFO", "replication"))
    identity = identity_of(run_id, history, node.call("CONFIG", "GET", "append*"))

    def acquire(key: str, token: str, waiter: str = "", hand_round: int = 0) -> bytes:
        ticket = 1_000_000 + len(key)
        command, _ = scripts.acquire_command(
            key, token, TTL_MS, OWNER, QUARANTINE_MS, waiter, ticket, LIFETIME_MS, hand_round
        )
        return command + identity

    def release(key: str, token: str, waiter: str = "", identified: bool = False) -> bytes:
        command = scripts.release_command(key, token, waiter, identified)[0]
        return command + identity if identified else command

    def token(prefix: str, i: int) -> str:
        return f"{prefix}{i:039d}"[-40:]

    def keys(case: str) -> list[str]:
        return [f"bench:{prefix}{case}:{i}" for i in range(calls)]

    granted = lambda reply: reply == b"OK"  # noqa: E731
    one = lambda reply: reply == 1  # noqa: E731
    rows = []
    # The owner key, as a client that holds locks already has it (the steady state).
    warm = f"bench:{prefix}warm"
    node.run([acquire(warm, token("w", 0)), release(warm, token("w", 0))])

    names = keys("min")
    rows.append(
        measure(
            node,
            "minimal acquire: SET NX PX",
            "set",
            [],
            [
                encode_command("SET", k, token("m", i), "NX", "PX", TTL_MS)
                for i, k in enumerate(names)
            ],
            granted,
        )
    )
    rows.append(
        measure(
            node,
            "minimal release: EVALSHA compare-and-delete",
            "evalsha",
            [],
            [encode_command("EVALSHA", SHA, 1, k, token("m", i)) for i, k in enumerate(names)],
            one,
        )
    )

    names = keys("single")
    rows.append(
        measure(
            node,
            "acquire.lua, single try, free",
            "evalsha",
            [],
            [acquire(k, token("a", i)) for i, k in enumerate(names)],
            granted,
        )
    )
    rows.append(
        measure(
            node,
            "release.lua, no waiter, no line",
            "evalsha",
            [],
            [release(k, token("a", i)) for i, k in enumerate(names)],
            one,
        )
    )

    # Renewal of a held lease (the auto-extender's and lease.extend()'s command), beside the
    # plain Redlock's extend: a compare-and-PEXPIRE script (redis-py's Lock.extend, pottery).
    names = keys("extend")
    rows.append(
        measure(
            node,
            "extend.lua, held lease renewed",
            "evalsha",
            [acquire(k, token("e", i)) for i, k in enumerate(names)],
            [
                scripts.extend_command(k, token("e", i), TTL_MS, OWNER)[0]
                for i, k in enumerate(names)
            ],
            one,
        )
    )
    sha = node.call("SCRIPT", "LOAD", COMPARE_AND_PEXPIRE)
    assert isinstance(sha, bytes)
    names = keys("min-extend")
    rows.append(
        measure(
            node,
            "minimal extend: EVALSHA compare-and-PEXPIRE",
            "evalsha",
            [
                encode_command("SET", k, token("x", i), "NX", "PX", TTL_MS)
                for i, k in enumerate(names)
            ],
            [
                encode_command("EVALSHA", sha, 1, k, token("x", i), TTL_MS)
                for i, k in enumerate(names)
            ],
            one,
        )
    )

    names = keys("blocking")
    rows.append(
        measure(
            node,
            "acquire.lua, waiter's first try (grants), free",
            "evalsha",
            [],
            [acquire(k, token("b", i), f"l{i}.n", 1) for i, k in enumerate(names)],
            granted,
        )
    )
    rows.append(
        measure(
            node,
            "release.lua, waiter id, no line",
            "evalsha",
            [],
            [release(k, token("b", i), f"l{i}.n") for i, k in enumerate(names)],
            one,
        )
    )

    # Hand-off (W3): a held lock, a waiter queued behind it (its try refused), then the
    # holder's release grants the lock to that waiter; then that waiter's release.
    names = keys("hand")
    rows.append(
        measure(
            node,
            "acquire.lua, waiter's try, held: queued",
            "evalsha",
            [acquire(k, token("h", i), f"h{i}.n", 1) for i, k in enumerate(names)],
            [acquire(k, token("g", i), f"g{i}.n", 1) for i, k in enumerate(names)],
            lambda reply: isinstance(reply, int) and reply > 0,
        )
    )
    rows.append(
        measure(
            node,
            "release.lua, hand-off grant to the head",
            "evalsha",
            [],
            [release(k, token("h", i), f"h{i}.n") for i, k in enumerate(names)],
            one,
        )
    )
    rows.append(
        measure(
            node,
            "release.lua, the granted waiter's release",
            "evalsha",
            [],
            [release(k, token("g", i), f"g{i}.n") for i, k in enumerate(names)],
            one,
        )
    )
    # The same hand-off, the release carrying the connection's identity (identify=True).
    names = keys("hand-identified")
    queue = [acquire(k, token("h", i), f"h{i}.n", 1) for i, k in enumerate(names)]
    queue += [acquire(k, token("g", i), f"g{i}.n", 1) for i, k in enumerate(names)]
    rows.append(
        measure(
            node,
            "release.lua, hand-off grant, identified",
            "evalsha",
            queue,
            [release(k, token("h", i), f"h{i}.n", True) for i, k in enumerate(names)],
            one,
        )
    )
    granted_after = node.run([encode_command("GET", k) for k in names])
    _replies_ok(
        granted_after,
        lambda reply: isinstance(reply, bytes) and reply.startswith(token("g", 0)[:1].encode()),
        "the identified release's grants",
    )

    def script_row(case: str, body: bytes, names: list[str], *extra: str) -> None:
        """Load ``body`` and measure it on each of ``names`` (its one key), with ``extra``."""
        sha = node.call("SCRIPT", "LOAD", body)
        assert isinstance(sha, bytes)
        commands = [encode_command("EVALSHA", sha, 1, k, *extra) for k in names]
        rows.append(measure(node, case, "evalsha", [], commands, one))

    # What a redis.call costs a script around its command, by the number of calls: a script
    # of n EXISTS of its (missing) key, against the empty script of one argument.
    for count in (1, 4, 13):
        body = b"local key = KEYS[1]\n" + b"redis.call('EXISTS', key)\n" * count + b"return 1"
        script_row(f"script of {count} EXISTS calls", body, keys(f"calls{count}"))

    # What a script's included helpers cost before it does anything: each one's local
    # functions are made anew on every call, the fast path's unused ones too (issue 43).
    # An include that runs code of the script's own (hand_register.lua) is left out.
    runs_code = re.compile(r"^(if|for|while|return)\b|^local \w+ = .*ARGV", re.MULTILINE)
    for hot in ("acquire", "release", "extend"):
        source = (scripts._SCRIPTS / f"{hot}.lua").read_text(encoding="utf-8")
        included = [
            name
            for name in scripts._INCLUDE.findall(source)
            if not runs_code.search(scripts._included(name))
        ]
        helpers = "\n".join(scripts._included(name) for name in included) + "\nreturn 1"
        script_row(
            f"{hot}.lua's {len(included)} includes alone, 1 key",
            helpers.encode(),
            keys(f"includes-{hot}"),
        )

    # What an EVALSHA costs before the script does anything, by argument count (idea 4).
    for count in (1, 4, 8, 14):
        body = b"return 1 -- %d" % count
        extra = ["x" * 8] * (count - 1)
        script_row(f"empty script, {count} keys+args", body, keys(f"empty{count}"), *extra)
    return rows


if __name__ == "__main__":
    main()
