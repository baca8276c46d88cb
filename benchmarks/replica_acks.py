"""The cost of replica acknowledgement (the node setting REPLICA_ACKS, issue 39) on W1.

W1's pair (acquire + release of a fresh key, one client, N=1) on two masters that each have a
real replica (same binary, ``--replicaof``, on this machine): one without REPLICA_ACKS, one
with ``?replica_acks=1`` (two masters, because a node that carries the acknowledgement claim
refuses clients without it). Interleaved rounds in a rotating order; p50 of each. With acks,
the acquire's script reads INFO replication and the reply waits for WAIT, i.e. for the
replica to apply the grant and acknowledge it (a replica sends REPLCONF ACK when the master
asks, which WAIT does at once): a round trip to the replica added to the one to the master.
The release is not acknowledged (a lost release frees nothing early).

Run: ``python -m benchmarks.replica_acks [--rounds 12] [--pairs 200]``; µs.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.pairs import ours
from django_redlock.localnodes import LocalNode


def _pair(directory: Path, name: str) -> tuple[LocalNode, LocalNode]:
    master = LocalNode(directory, name=f"{name}m", tcp=True)
    master.start()
    replica = LocalNode(
        directory,
        name=f"{name}r",
        tcp=True,
        extra_args=("--replicaof", "127.0.0.1", str(master.port)),
    )
    replica.start(fresh=False)
    return master, replica


def _online(node: LocalNode) -> bool:
    import redis

    client = redis.Redis.from_url(node.url)
    try:
        info = client.info("replication")
        return any(
            isinstance(value, dict) and value.get("state") == "online" for value in info.values()
        )
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--pairs", type=int, default=200, help="pairs per contender per round")
    options = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="rl-bench-acks-", dir="/tmp"))
    nodes: list[LocalNode] = []
    try:
        off_master, off_replica = _pair(directory, "o")
        on_master, on_replica = _pair(directory, "a")
        nodes += [off_replica, off_master, on_replica, on_master]
        deadline = time.monotonic() + 30
        while not (_online(off_master) and _online(on_master)):
            if time.monotonic() > deadline:
                raise RuntimeError("the replicas did not come online")
            time.sleep(0.05)
        runners = {
            "acks off (replica)": ours([off_master.url]),
            "REPLICA_ACKS 1": ours([f"{on_master.url}?replica_acks=1"]),
        }
        labels = list(runners)
        samples: dict[str, list[float]] = {label: [] for label in labels}
        for round_index in range(options.rounds + 1):  # round 0 warms up, not counted
            shift = round_index % len(labels)
            for label in labels[shift:] + labels[:shift]:
                run = runners[label]
                for index in range(options.pairs):
                    started = time.perf_counter()
                    if not run(f"ra:{round_index}:{index}"):
                        raise RuntimeError(f"{label}: a pair failed")
                    if round_index:
                        samples[label].append(time.perf_counter() - started)
    finally:
        for node in nodes:
            node.stop()
        shutil.rmtree(directory, ignore_errors=True)
    print(f"W1 pair with a real replica, N=1, {options.rounds} rounds of {options.pairs} pairs")
    base = statistics.median(samples[labels[0]])
    for label in labels:
        p50 = statistics.median(samples[label])
        p99 = statistics.quantiles(samples[label], n=100)[98]
        print(f"{label:20} p50 {p50 * 1e6:7.1f} µs  p99 {p99 * 1e6:7.1f} µs  x{p50 / base:.2f}")


if __name__ == "__main__":
    main()
