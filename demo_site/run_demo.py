"""``./run demo``: start three local nodes, migrate SQLite, and serve the demo site.

The nodes live as long as this process; Ctrl-C stops the server and the nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path

from django_redlock.localnodes import LocalCluster, server_version

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=3, help="how many nodes (default 3)")
    parser.add_argument("--addr", default="127.0.0.1:8000", help="where to serve")
    args = parser.parse_args(argv)

    with LocalCluster(args.nodes) as cluster:
        print(f"started {args.nodes} nodes ({server_version()}):")
        for url in cluster.urls:
            print(f"  {url}")
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "demo_site.settings",
            "REDLOCK_DEMO_NODES": ",".join(cluster.urls),
        }
        manage = [sys.executable, str(ROOT / "manage.py")]
        subprocess.run([*manage, "migrate", "--no-input", "-v", "0"], env=env, check=True)
        print(f"serving the demo on http://{args.addr}/ (Ctrl-C to stop)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            subprocess.run([*manage, "runserver", "--noreload", args.addr], env=env, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
